//! One connection to the server: TCP, TLS when configured, and the
//! registration that turns it into a client with a nick (IRCv3 SASL
//! PLAIN first when configured, then `PASS`, `NICK`, `USER`, nick
//! collisions handled, until the server's welcome).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use talaria_adapter::AdapterError;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio_util::codec::{AnyDelimiterCodec, AnyDelimiterCodecError, FramedRead};

use super::line::{self, Message};

/// The longest line read; IRCv3 tags may add 8 KiB to the 512 bytes.
const MAX_READ_LINE: usize = 8192 + line::MAX_LINE_BYTES;

/// How many nicks are tried before registration gives up.
const MAX_NICK_ATTEMPTS: usize = 10;

/// A byte stream, plain or TLS.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// Where and how to connect, and who to be.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub tls: bool,
    /// Extra certificates to trust (PEM).
    pub ca_file: Option<String>,
    pub nick: String,
    pub server_password: Option<String>,
    /// SASL PLAIN account and password.
    pub sasl: Option<(String, String)>,
}

/// A registered connection: lines in, lines out.
pub struct Connection {
    pub reader: FramedRead<ReadHalf<Box<dyn Stream>>, AnyDelimiterCodec>,
    pub writer: WriteHalf<Box<dyn Stream>>,
    /// The nick the server gave us in its welcome.
    pub nick: String,
}

impl Connection {
    /// Writes one line, adding the CRLF.
    pub async fn write(&mut self, text: &str) -> Result<(), AdapterError> {
        write_line(&mut self.writer, text).await
    }

    /// The next line from the server; `None` when it closed the
    /// connection. An overlong line is skipped, as a server never sends
    /// one.
    pub async fn read(&mut self) -> Result<Option<Message>, AdapterError> {
        read_from(&mut self.reader).await
    }
}

async fn write_line(
    writer: &mut WriteHalf<Box<dyn Stream>>,
    text: &str,
) -> Result<(), AdapterError> {
    let mut bytes = Vec::with_capacity(text.len() + 2);
    bytes.extend_from_slice(text.as_bytes());
    bytes.extend_from_slice(b"\r\n");
    writer
        .write_all(&bytes)
        .await
        .map_err(|e| AdapterError::Disconnected(format!("writing to the IRC server failed: {e}")))
}

/// The next message on `reader` (see [`Connection::read`]); apart from
/// the connection so a `select!` can read while another branch writes.
pub async fn read_from(
    reader: &mut FramedRead<ReadHalf<Box<dyn Stream>>, AnyDelimiterCodec>,
) -> Result<Option<Message>, AdapterError> {
    loop {
        let bytes: Bytes = match reader.next().await {
            None => return Ok(None),
            Some(Ok(bytes)) => bytes,
            Some(Err(AnyDelimiterCodecError::MaxChunkLengthExceeded)) => {
                tracing::warn!("skipping an overlong line from the IRC server");
                continue;
            }
            Some(Err(AnyDelimiterCodecError::Io(e))) => {
                return Err(AdapterError::Disconnected(format!(
                    "reading from the IRC server failed: {e}"
                )));
            }
        };
        // Servers relay whatever bytes clients sent; text that is not
        // UTF-8 (an old client's Latin-1) is read with replacement marks
        // rather than dropped.
        let text = String::from_utf8_lossy(&bytes);
        if let Some(message) = Message::parse(&text) {
            return Ok(Some(message));
        }
    }
}

/// Connects and registers, all within `timeout`.
pub async fn open(endpoint: &Endpoint, timeout: Duration) -> Result<Connection, AdapterError> {
    match tokio::time::timeout(timeout, open_inner(endpoint)).await {
        Ok(r) => r,
        Err(_) => Err(AdapterError::Disconnected(format!(
            "connecting to and registering with {}:{} took longer than {timeout:?}",
            endpoint.host, endpoint.port
        ))),
    }
}

async fn open_inner(endpoint: &Endpoint) -> Result<Connection, AdapterError> {
    let address = format!("{}:{}", endpoint.host, endpoint.port);
    let tcp = TcpStream::connect((endpoint.host.as_str(), endpoint.port))
        .await
        .map_err(|e| AdapterError::Disconnected(format!("cannot connect to {address}: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let stream: Box<dyn Stream> = if endpoint.tls {
        let connector = tls_connector(endpoint.ca_file.as_deref())?;
        let name = rustls::pki_types::ServerName::try_from(endpoint.host.clone()).map_err(|e| {
            AdapterError::Fatal(format!(
                "{:?} is not a host name for TLS: {e}",
                endpoint.host
            ))
        })?;
        let tls = connector.connect(name, tcp).await.map_err(|e| {
            AdapterError::Disconnected(format!("the TLS handshake with {address} failed: {e}"))
        })?;
        Box::new(tls)
    } else {
        Box::new(tcp)
    };
    let (read, writer) = tokio::io::split(stream);
    let reader = FramedRead::new(
        read,
        AnyDelimiterCodec::new_with_max_length(b"\n".to_vec(), Vec::new(), MAX_READ_LINE),
    );
    let mut conn = Connection {
        reader,
        writer,
        nick: endpoint.nick.clone(),
    };
    register(&mut conn, endpoint).await?;
    Ok(conn)
}

/// The TLS client: the web's public roots, and `ca_file`'s certificates.
fn tls_connector(ca_file: Option<&str>) -> Result<tokio_rustls::TlsConnector, AdapterError> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca_file {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let certs = CertificateDer::pem_file_iter(Path::new(path))
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| {
                AdapterError::Fatal(format!("cannot read the certificates in {path}: {e}"))
            })?;
        if certs.is_empty() {
            return Err(AdapterError::Fatal(format!(
                "{path} holds no PEM certificate (platforms.irc.tls_ca_file, IRC_TLS_CA_FILE)"
            )));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| {
                AdapterError::Fatal(format!("a certificate in {path} is not usable: {e}"))
            })?;
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| AdapterError::Fatal(format!("cannot set up TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Registration, up to the server's `001` welcome.
async fn register(conn: &mut Connection, endpoint: &Endpoint) -> Result<(), AdapterError> {
    if endpoint.sasl.is_some() {
        // Registration waits for `CAP END` once a client asked.
        conn.write("CAP LS 302").await?;
    }
    if let Some(password) = &endpoint.server_password {
        conn.write(&format!("PASS {password}")).await?;
    }
    let mut attempt = 0;
    conn.write(&format!("NICK {}", endpoint.nick)).await?;
    conn.write(&format!("USER {} 0 * :Talaria", user_name(&endpoint.nick)))
        .await?;
    let mut offered = String::new();
    loop {
        let Some(m) = conn.read().await? else {
            return Err(AdapterError::Disconnected(
                "the IRC server closed the connection during registration".into(),
            ));
        };
        match m.command.as_str() {
            "PING" => conn.write(&format!("PONG :{}", m.param(0))).await?,
            "ERROR" => {
                return Err(AdapterError::Disconnected(format!(
                    "the IRC server ended the connection: {}",
                    m.param(0)
                )));
            }
            "001" => {
                conn.nick = m.param(0).to_owned();
                return Ok(());
            }
            // Nick in use, erroneous, colliding or unavailable: the next
            // fallback (`nick_`, `nick_1`, ...).
            "433" | "432" | "436" | "437" => {
                attempt += 1;
                if attempt >= MAX_NICK_ATTEMPTS {
                    return Err(AdapterError::Fatal(format!(
                        "the IRC server refused {MAX_NICK_ATTEMPTS} nicks after {} ({})",
                        endpoint.nick,
                        m.params.last().map_or("", String::as_str)
                    )));
                }
                let next = line::fallback_nick(&endpoint.nick, attempt);
                tracing::info!(
                    refused = m.param(1),
                    next,
                    "IRC nick not available; trying another"
                );
                conn.write(&format!("NICK {next}")).await?;
            }
            "464" => {
                return Err(AdapterError::Fatal(
                    "the IRC server refused the connection password \
                     (platforms.irc.server_password, IRC_SERVER_PASSWORD)"
                        .into(),
                ));
            }
            "465" => {
                return Err(AdapterError::Fatal(format!(
                    "the IRC server bans this connection: {}",
                    m.params.last().map_or("", String::as_str)
                )));
            }
            "CAP" => sasl_step(conn, endpoint, &m, &mut offered).await?,
            "AUTHENTICATE" if m.param(0) == "+" => {
                if let Some((account, password)) = &endpoint.sasl {
                    for piece in line::sasl_plain(account, password) {
                        conn.write(&format!("AUTHENTICATE {piece}")).await?;
                    }
                }
            }
            // Logged in (900), SASL done (903): registration may end.
            "903" => conn.write("CAP END").await?,
            "904" | "905" | "902" => {
                return Err(AdapterError::Fatal(format!(
                    "SASL login as {:?} failed: {} (platforms.irc.sasl_username and \
                     sasl_password, IRC_SASL_USERNAME and IRC_SASL_PASSWORD)",
                    endpoint.sasl.as_ref().map_or("", |(a, _)| a.as_str()),
                    m.params.last().map_or("", String::as_str)
                )));
            }
            "906" => {
                return Err(AdapterError::Disconnected(
                    "the IRC server aborted the SASL login".into(),
                ));
            }
            "421" if endpoint.sasl.is_some() && m.param(1).eq_ignore_ascii_case("CAP") => {
                return Err(sasl_unsupported("it does not know CAP"));
            }
            _ => {}
        }
    }
}

/// One `CAP` reply during a SASL login: the capability list, then the
/// server's answer to our request.
async fn sasl_step(
    conn: &mut Connection,
    endpoint: &Endpoint,
    m: &Message,
    offered: &mut String,
) -> Result<(), AdapterError> {
    if endpoint.sasl.is_none() {
        return Ok(());
    }
    match m.param(1).to_ascii_uppercase().as_str() {
        "LS" => {
            // `CAP * LS * :...` continues on another line; the last has
            // no `*`.
            let more = m.params.len() > 3 && m.param(2) == "*";
            offered.push(' ');
            offered.push_str(m.params.last().map_or("", String::as_str));
            if more {
                return Ok(());
            }
            let sasl = offered
                .split_whitespace()
                .find_map(|cap| match cap.split_once('=') {
                    Some(("sasl", mechanisms)) => Some(Some(mechanisms)),
                    None if cap == "sasl" => Some(None),
                    _ => None,
                });
            match sasl {
                None => Err(sasl_unsupported("it does not offer the sasl capability")),
                Some(Some(mechanisms))
                    if !mechanisms
                        .split(',')
                        .any(|m| m.eq_ignore_ascii_case("PLAIN")) =>
                {
                    Err(sasl_unsupported(&format!(
                        "it offers only {mechanisms}, not PLAIN"
                    )))
                }
                Some(_) => conn.write("CAP REQ :sasl").await,
            }
        }
        "ACK" => conn.write("AUTHENTICATE PLAIN").await,
        "NAK" => Err(sasl_unsupported("it refused the sasl capability")),
        _ => Ok(()),
    }
}

fn sasl_unsupported(why: &str) -> AdapterError {
    AdapterError::Fatal(format!(
        "SASL is configured (platforms.irc.sasl_password, IRC_SASL_PASSWORD) but the IRC \
         server cannot do it: {why}"
    ))
}

/// The `USER` name: the nick's letters and digits, at most ten (what
/// servers keep of it).
fn user_name(nick: &str) -> String {
    let name: String = nick
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(10)
        .collect();
    if name.is_empty() {
        "talaria".to_owned()
    } else {
        name.to_ascii_lowercase()
    }
}
