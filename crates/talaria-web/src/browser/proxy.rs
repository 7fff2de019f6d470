//! The forward proxy the local Chromium sends every request through, so
//! that the guard decides every address a page reaches: navigations,
//! images, scripts, fetches, WebSockets, redirects.
//!
//! Two shapes of request arrive: `CONNECT host:port` (HTTPS and secure
//! WebSockets: a tunnel) and absolute-form `GET http://host/path` (plain
//! HTTP). Either way the host goes through [`UrlGuard::resolve`] and the
//! connection is made to one of the addresses it checked, never to the
//! name again, so DNS cannot answer differently the second time. A refusal
//! is a `403` whose body is the guard's sentence.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use url::Url;

use crate::guard::{GuardError, UrlGuard};

/// Largest request head read (request line and headers).
const MAX_HEAD: usize = 32 * 1024;

/// Connections handled at once; more wait for a free slot.
const MAX_CONNECTIONS: usize = 256;

/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// How long connecting to the site may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// The running proxy; stops when dropped.
pub(crate) struct Proxy {
    port: u16,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1.
    pub(crate) async fn start(guard: UrlGuard) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let task = tokio::spawn(async move {
            loop {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (stream, _) = match listener.accept().await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::debug!("browser proxy accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let guard = guard.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(stream, &guard).await {
                        tracing::debug!("browser proxy: {e}");
                    }
                    drop(permit);
                });
            }
        });
        Ok(Proxy { port, task })
    }

    /// The port on 127.0.0.1.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the request head asked for.
enum Ask {
    /// `CONNECT host:port`.
    Tunnel { host: String, port: u16 },
    /// An absolute-form plain HTTP request.
    Http { url: Url },
}

async fn serve(mut client: TcpStream, guard: &UrlGuard) -> std::io::Result<()> {
    let (head, rest) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
        Ok(Ok(Some(h))) => h,
        Ok(Ok(None)) | Err(_) => return Ok(()),
        Ok(Err(e)) => return Err(e),
    };
    let text = String::from_utf8_lossy(&head);
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let ask = match parse(method, target) {
        Ok(ask) => ask,
        Err(why) => return answer(&mut client, 400, "Bad Request", &why).await,
    };
    let (host, port, shown) = match &ask {
        Ask::Tunnel { host, port } => (host.clone(), *port, format!("https://{host}:{port}/")),
        Ask::Http { url } => {
            if let Err(e) = guard.check_url(url) {
                return refuse(&mut client, &e).await;
            }
            let host = url.host_str().unwrap_or_default().to_owned();
            let port = url.port_or_known_default().unwrap_or(80);
            (host, port, url.to_string())
        }
    };
    let addrs = match guard.resolve(&host).await {
        Ok(a) => a,
        Err(e) => return refuse(&mut client, &e).await,
    };
    let mut upstream = None;
    let mut last_error = String::new();
    for ip in addrs {
        match tokio::time::timeout(
            CONNECT_TIMEOUT,
            TcpStream::connect(SocketAddr::new(ip, port)),
        )
        .await
        {
            Ok(Ok(s)) => {
                upstream = Some(s);
                break;
            }
            Ok(Err(e)) => last_error = e.to_string(),
            Err(_) => last_error = "timed out".into(),
        }
    }
    let Some(mut upstream) = upstream else {
        let why = format!("cannot connect to {shown}: {last_error}");
        return answer(&mut client, 502, "Bad Gateway", &why).await;
    };
    match ask {
        Ask::Tunnel { .. } => {
            client
                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await?;
            upstream.write_all(&rest).await?;
        }
        Ask::Http { url } => {
            // Origin-form to the site; one request per connection, so a
            // second request on the same client connection cannot ride on
            // this checked one to another host.
            let mut out = format!("{method} {} HTTP/1.1\r\n", origin_form(&url));
            for line in lines {
                if line.is_empty() {
                    continue;
                }
                let name = line.split(':').next().unwrap_or("").trim();
                if [
                    "proxy-connection",
                    "proxy-authorization",
                    "connection",
                    "keep-alive",
                ]
                .iter()
                .any(|h| name.eq_ignore_ascii_case(h))
                {
                    continue;
                }
                out.push_str(line);
                out.push_str("\r\n");
            }
            out.push_str("Connection: close\r\n\r\n");
            upstream.write_all(out.as_bytes()).await?;
            upstream.write_all(&rest).await?;
        }
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    Ok(())
}

fn parse(method: &str, target: &str) -> Result<Ask, String> {
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = target
            .rsplit_once(':')
            .ok_or_else(|| format!("CONNECT needs host:port, not {target}"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| format!("CONNECT needs host:port, not {target}"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err("CONNECT without a host".into());
        }
        return Ok(Ask::Tunnel {
            host: host.to_owned(),
            port,
        });
    }
    let url = Url::parse(target).map_err(|_| {
        format!("this proxy takes absolute http:// URLs or CONNECT, not {method} {target}")
    })?;
    if url.scheme() != "http" {
        return Err(format!("the {} scheme is not proxied", url.scheme()));
    }
    Ok(Ask::Http { url })
}

fn origin_form(url: &Url) -> String {
    match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_owned(),
    }
}

/// Reads up to the end of the head; returns the head and any bytes read
/// past it. `None` when the client closed first.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            buf.truncate(end);
            return Ok(Some((buf, rest)));
        }
        if buf.len() > MAX_HEAD {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "request head too large",
            ));
        }
    }
}

async fn refuse(client: &mut TcpStream, e: &GuardError) -> std::io::Result<()> {
    tracing::info!("browser request refused: {e}");
    answer(client, 403, "Forbidden", &e.to_string()).await
}

async fn answer(
    client: &mut TcpStream,
    code: u16,
    status: &str,
    body: &str,
) -> std::io::Result<()> {
    let response = format!(
        "HTTP/1.1 {code} {status}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(response.as_bytes()).await?;
    client.shutdown().await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::guard::StaticLookup;

    fn guard() -> UrlGuard {
        let lookup = StaticLookup::default()
            .with(
                "site.test",
                &["127.0.0.1"
                    .parse()
                    .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into())],
            )
            .with(
                "inside.test",
                &["10.1.2.3"
                    .parse()
                    .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into())],
            );
        UrlGuard::with_lookup(false, &["127.0.0.1".to_owned()], Arc::new(lookup))
            .unwrap_or_else(|e| panic!("guard: {e}"))
    }

    /// A server that echoes what it reads, prefixed, once.
    async fn echo() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let mut out = b"echo:".to_vec();
                    out.extend_from_slice(&buf[..n]);
                    let _ = s.write_all(&out).await;
                });
            }
        });
        port
    }

    async fn exchange(proxy: u16, send: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", proxy))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        s.write_all(send.as_bytes())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn a_tunnel_reaches_an_allowed_address_only() {
        let proxy = Proxy::start(guard())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let port = echo().await;
        let out = exchange(
            proxy.port(),
            &format!("CONNECT site.test:{port} HTTP/1.1\r\nHost: site.test:{port}\r\n\r\nhello"),
        )
        .await;
        assert_eq!(out, "HTTP/1.1 200 Connection Established\r\n\r\necho:hello");

        for target in [
            format!("localhost:{port}"),
            "inside.test:443".to_owned(),
            "10.0.0.1:443".to_owned(),
            "[::1]:443".to_owned(),
        ] {
            let out = exchange(proxy.port(), &format!("CONNECT {target} HTTP/1.1\r\n\r\n")).await;
            assert!(
                out.starts_with("HTTP/1.1 403 Forbidden\r\n"),
                "{target}: {out}"
            );
            assert!(out.contains("refused to fetch"), "{target}: {out}");
        }
    }

    #[tokio::test]
    async fn a_plain_request_goes_out_in_origin_form_once() {
        let proxy = Proxy::start(guard())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let port = echo().await;
        let out = exchange(
            proxy.port(),
            &format!(
                "GET http://127.0.0.1:{port}/path?q=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
                 Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\n\r\n"
            ),
        )
        .await;
        assert!(out.starts_with("echo:GET /path?q=1 HTTP/1.1\r\n"), "{out}");
        assert!(
            out.contains(&format!("Host: 127.0.0.1:{port}\r\n")),
            "{out}"
        );
        assert!(out.contains("Connection: close\r\n"), "{out}");
        assert!(!out.to_ascii_lowercase().contains("proxy-"), "{out}");

        let out = exchange(
            proxy.port(),
            "GET http://169.254.169.254/latest/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{out}");
        assert!(out.contains("metadata"), "{out}");
        let out = exchange(proxy.port(), "GET /relative HTTP/1.1\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
        let out = exchange(proxy.port(), "GET ftp://site.test/x HTTP/1.1\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
    }
}
