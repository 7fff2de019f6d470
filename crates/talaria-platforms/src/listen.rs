//! Binding and serving the TCP listeners of the HTTP adapters (the API
//! server, the shared webhook listener), with the limits that keep a flood
//! of connections from taking the whole gateway down.
//!
//! Every connection costs a file descriptor, and the gateway's own work
//! (the database, the model provider, the platforms' connections, MCP
//! servers' pipes) needs descriptors too: a listener that accepts without
//! limit lets idle clients holding half a request exhaust the process's
//! open-file limit, after which `/health` hangs and a user's turn fails
//! with "Too many open files". So each listener:
//!
//! - closes a connection whose request head has not fully arrived within
//!   the header timeout (also the most a kept-alive connection idles
//!   between requests), and fails a request whose body has not fully
//!   arrived within the body timeout;
//! - holds at most [`ConnectionLimits::max_connections`] connections,
//!   derived from the open-file limit so that a reserve stays for the
//!   gateway's own work ([`connections_for`]). When all are taken, the
//!   oldest connection that is not serving a request (one still sending
//!   its head, or idling between requests) is closed to make room; when
//!   every connection is serving, new ones wait in the kernel's accept
//!   backlog, which costs the process no descriptor.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a client may take to send a request head, counted from the
/// connection (or the end of its previous request): a slow client on a
/// poor link sends a head in well under a second.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to send a request body, counted from its
/// head: the largest bodies taken (10 MiB on the API server) arrive in
/// that time at about 350 kB/s.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Descriptors always kept for the gateway's own work, whatever the limit.
const MIN_RESERVE: u64 = 128;

/// HTTP listeners a gateway may run (the API server and the webhook
/// listener): what is left after the reserve is split between them.
const LISTENERS: u64 = 2;

/// The fewest connections a listener holds, even under a tiny limit.
const MIN_CONNECTIONS: usize = 16;

/// The most connections a listener holds, even under a huge limit: each
/// may buffer a request head, so this bounds memory as well.
const MAX_CONNECTIONS: usize = 4096;

/// Pause after the listener fails to accept for want of descriptors (or
/// memory), so the loop does not spin while the process recovers.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(250);

/// How often, at most, a full listener is reported in the log.
const FULL_REPORT_EVERY: Duration = Duration::from_secs(60);

/// What one listener allows its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// See [`DEFAULT_HEADER_TIMEOUT`].
    pub header_timeout: Duration,
    /// See [`DEFAULT_BODY_TIMEOUT`].
    pub body_timeout: Duration,
    /// Connections held at once (see the module docs for what happens
    /// beyond).
    pub max_connections: usize,
}

impl ConnectionLimits {
    /// The default timeouts, and a connection cap derived from this
    /// process's soft open-file limit as it is now (see
    /// [`connections_for`]).
    pub fn for_this_process() -> ConnectionLimits {
        let max_connections = match open_file_limit() {
            Some(soft) => connections_for(soft),
            None => {
                tracing::warn!(
                    "cannot read the open-file limit; assuming 1024 for the connection cap"
                );
                connections_for(1024)
            }
        };
        ConnectionLimits {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_connections,
        }
    }

    /// These limits with the timeouts configured, in seconds.
    ///
    /// # Errors
    /// When either is 0: a listener without them is what a flood of idle
    /// connections takes down.
    pub fn with_timeouts(
        self,
        header_secs: u64,
        body_secs: u64,
    ) -> Result<ConnectionLimits, ZeroTimeout> {
        if header_secs == 0 {
            return Err(ZeroTimeout("header_timeout_secs"));
        }
        if body_secs == 0 {
            return Err(ZeroTimeout("body_timeout_secs"));
        }
        Ok(ConnectionLimits {
            header_timeout: Duration::from_secs(header_secs),
            body_timeout: Duration::from_secs(body_secs),
            ..self
        })
    }
}

/// A listener's timeout was configured as 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} must be at least 1 (seconds)")]
pub struct ZeroTimeout(pub &'static str);

/// This process's soft open-file limit (`RLIMIT_NOFILE`).
pub fn open_file_limit() -> Option<u64> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _hard)| soft)
}

/// The connections one listener may hold under a soft open-file limit of
/// `soft`: a quarter of the limit (at least [`MIN_RESERVE`]) stays for the
/// gateway's own work, and the rest is split between the two listeners,
/// within [`MIN_CONNECTIONS`]..=[`MAX_CONNECTIONS`]. 1,024 (a systemd
/// user unit's default) gives 384 each; 256 gives 64; 65,536 gives 4,096.
pub fn connections_for(soft: u64) -> usize {
    let reserve = MIN_RESERVE.max(soft / 4);
    let share = soft.saturating_sub(reserve) / LISTENERS;
    usize::try_from(share)
        .unwrap_or(usize::MAX)
        .clamp(MIN_CONNECTIONS, MAX_CONNECTIONS)
}

/// Binds `host:port` and reads back the address actually bound (port 0
/// becomes a real port), so callers can print and connect to it.
///
/// # Errors
/// `host:port` as configured, for the caller's error message, with what
/// the operating system said (in use, not permitted, unknown host).
pub async fn bind_listener(
    host: &str,
    port: u16,
) -> Result<(TcpListener, SocketAddr), (String, std::io::Error)> {
    let failed = |source| (format!("{host}:{port}"), source);
    let listener = TcpListener::bind((host, port)).await.map_err(failed)?;
    let addr = listener.local_addr().map_err(failed)?;
    Ok((listener, addr))
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes,
/// then stops accepting, lets each connection finish the request it is
/// serving, and returns once all are closed.
///
/// # Errors
/// None today: failures to accept are logged and retried, since they
/// come and go with the process's descriptors. The `Result` is kept for
/// the callers' signatures.
pub async fn serve(
    name: &'static str,
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    tracing::info!(
        listener = name,
        max_connections = limits.max_connections,
        header_timeout = ?limits.header_timeout,
        body_timeout = ?limits.body_timeout,
        "serving connections"
    );
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let table = Table::default();
    let tracker = TaskTracker::new();
    let closing = CancellationToken::new();
    let service = TowerToHyperService::new(app);
    let mut last_full_report: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let permit = match slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if last_full_report.is_none_or(|at| at.elapsed() >= FULL_REPORT_EVERY) {
                    last_full_report = Some(Instant::now());
                    tracing::warn!(
                        listener = name,
                        max_connections = limits.max_connections,
                        "a listener holds as many connections as it may; closing idle ones to \
                         make room (reported at most once a minute)"
                    );
                }
                table.evict_oldest_idle();
                tokio::select! {
                    permit = slots.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        // The semaphore is never closed.
                        Err(_) => break,
                    },
                    () = &mut shutdown => break,
                }
            }
        };
        set_no_delay(&stream);
        let conn = table.open();
        let service = service.clone();
        let closing = closing.clone();
        tracker.spawn(async move {
            serve_connection(stream, service, limits, conn, closing).await;
            drop(permit);
        });
    }
    drop(listener);
    closing.cancel();
    tracker.close();
    tracker.wait().await;
    Ok(())
}

async fn accept_failed(e: &std::io::Error) {
    use std::io::ErrorKind;
    // The peer gave up before it was accepted: nothing to wait for.
    if matches!(
        e.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    ) {
        return;
    }
    tracing::warn!(error = %e, "cannot accept a connection; retrying shortly");
    tokio::time::sleep(ACCEPT_BACKOFF).await;
}

/// Without `TCP_NODELAY`, a second small write (the next server-sent event,
/// a body after its headers) waits until the first is acknowledged, and
/// the peer delays that acknowledgement by up to 40 ms: every streamed
/// answer would stall once per event.
fn set_no_delay(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY; serving anyway");
    }
}

async fn serve_connection(
    stream: TcpStream,
    app: TowerToHyperService<Router>,
    limits: ConnectionLimits,
    conn: OpenConnection,
    closing: CancellationToken,
) {
    let state = conn.state.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        // Counted from here until the response body is dropped, so a
        // streamed answer is never taken for an idle connection.
        let busy = Busy::enter(state.clone());
        let request = request.map(|body| Deadline::new(body, limits.body_timeout));
        let answer = hyper::service::Service::call(&app, request);
        async move {
            let response = match answer.await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            Ok::<_, Infallible>(response.map(|body| Held { body, _busy: busy }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        done = connection.as_mut() => {
            if let Err(e) = done {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        // Dropping the connection closes its socket.
        () = conn.state.evict.cancelled() => {
            tracing::debug!("closed an idle connection to make room for a new one");
        }
        () = closing.cancelled() => {
            connection.as_mut().graceful_shutdown();
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error while stopping");
            }
        }
    }
}

/// The open connections of one listener, oldest first.
#[derive(Default, Clone)]
struct Table {
    inner: Arc<Mutex<TableInner>>,
}

#[derive(Default)]
struct TableInner {
    next: u64,
    open: BTreeMap<u64, Arc<ConnState>>,
}

struct ConnState {
    /// Requests being served on the connection (HTTP/1 serves one at a
    /// time, but the count makes the guard simple).
    busy: AtomicUsize,
    /// Cancelled to close the connection to make room.
    evict: CancellationToken,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, TableInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open(&self) -> OpenConnection {
        let state = Arc::new(ConnState {
            busy: AtomicUsize::new(0),
            evict: CancellationToken::new(),
        });
        let mut inner = self.lock();
        let id = inner.next;
        inner.next += 1;
        inner.open.insert(id, state.clone());
        OpenConnection {
            table: self.clone(),
            id,
            state,
        }
    }

    /// Closes the oldest connection not serving a request, unless one
    /// closed for that reason is still going away (its slot comes back
    /// as soon as it has).
    fn evict_oldest_idle(&self) {
        let inner = self.lock();
        if inner.open.values().any(|c| c.evict.is_cancelled()) {
            return;
        }
        // A request may begin on the chosen connection between this check
        // and its closing; that client sees its connection closed, as on
        // any server that sheds load, and may retry.
        if let Some(idle) = inner
            .open
            .values()
            .find(|c| c.busy.load(Ordering::Acquire) == 0)
        {
            idle.evict.cancel();
        }
    }
}

/// A connection's entry in its listener's [`Table`], removed when dropped.
struct OpenConnection {
    table: Table,
    id: u64,
    state: Arc<ConnState>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.table.lock().open.remove(&self.id);
    }
}

/// A request being served: the connection is busy while one is held.
struct Busy(Arc<ConnState>);

impl Busy {
    fn enter(state: Arc<ConnState>) -> Busy {
        state.busy.fetch_add(1, Ordering::AcqRel);
        Busy(state)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its connection counted as busy until it
/// has been sent (or dropped).
struct Held {
    body: Body,
    _busy: Busy,
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The request body did not fully arrive within the body timeout.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
struct BodyTimeout(Duration);

/// A request body that fails once its deadline has passed, so a client
/// sending a body slowly (or not at all) cannot hold its connection and
/// the handler reading it for longer than the body timeout.
struct Deadline {
    body: Incoming,
    timeout: Duration,
    deadline: tokio::time::Instant,
    /// Set the first time the body has to be waited for: most bodies
    /// (and every empty one) never need a timer.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Deadline {
    fn new(body: Incoming, timeout: Duration) -> Deadline {
        Deadline {
            body,
            timeout,
            deadline: tokio::time::Instant::now() + timeout,
            sleep: None,
        }
    }
}

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.as_mut().poll(cx).is_ready() {
            tracing::debug!(timeout = ?this.timeout, "a request body arrived too slowly");
            return Poll::Ready(Some(Err(Box::new(BodyTimeout(this.timeout)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::time::timeout;

    const WAIT: Duration = Duration::from_secs(20);

    async fn start(app: Router, limits: ConnectionLimits) -> (SocketAddr, CancellationToken) {
        let (listener, addr) = bind_listener("127.0.0.1", 0).await.unwrap();
        let stop = CancellationToken::new();
        let done = stop.clone();
        tokio::spawn(serve("test", listener, app, limits, async move {
            done.cancelled().await;
        }));
        (addr, stop)
    }

    /// What the server sends on `s` until it closes it, within [`WAIT`].
    async fn until_closed(s: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match timeout(WAIT, s.read(&mut buf)).await {
                Err(_) => panic!("not closed within {WAIT:?}; got {out:?}"),
                Ok(Ok(0) | Err(_)) => return String::from_utf8_lossy(&out).into_owned(),
                Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            }
            assert!(out.len() < 64 * 1024);
        }
    }

    #[tokio::test]
    async fn a_stalled_head_and_a_stalled_body_are_cut_off() {
        let app = Router::new().route(
            "/echo",
            post(|body: Bytes| async move { body.len().to_string() }),
        );
        let limits = ConnectionLimits {
            header_timeout: Duration::from_millis(300),
            body_timeout: Duration::from_millis(300),
            max_connections: 8,
        };
        let (addr, stop) = start(app, limits).await;

        // Nothing at all, then half a head: both closed.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut half = TcpStream::connect(addr).await.unwrap();
        half.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        until_closed(&mut silent).await;
        until_closed(&mut half).await;

        // A body declared as 10 bytes of which 3 arrive: the request
        // fails and the connection is closed.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
            .await
            .unwrap();
        let answer = until_closed(&mut slow).await;
        assert!(answer.starts_with("HTTP/1.1 4"), "{answer:?}");

        // A whole request is served.
        let mut whole = TcpStream::connect(addr).await.unwrap();
        whole
            .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc")
            .await
            .unwrap();
        let answer = until_closed(&mut whole).await;
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("3"),
            "{answer:?}"
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn a_full_listener_closes_an_idle_connection_never_one_serving_a_request() {
        let release = Arc::new(tokio::sync::Notify::new());
        let entered = Arc::new(tokio::sync::Notify::new());
        let (held, inside) = (release.clone(), entered.clone());
        let app = Router::new()
            .route(
                "/slow",
                get(move || {
                    let (held, inside) = (held.clone(), inside.clone());
                    async move {
                        inside.notify_one();
                        held.notified().await;
                        "slow done"
                    }
                }),
            )
            .route("/fast", get(|| async { "fast" }));
        let limits = ConnectionLimits {
            header_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(60),
            max_connections: 2,
        };
        let (addr, stop) = start(app, limits).await;

        // The oldest connection is serving a request; the second idles
        // with half a head.
        let mut busy = TcpStream::connect(addr).await.unwrap();
        busy.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        timeout(WAIT, entered.notified()).await.unwrap();
        // Accepted after the busy one and before the third (the backlog
        // is first in, first out).
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET /fast HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();

        let mut third = TcpStream::connect(addr).await.unwrap();
        third
            .write_all(b"GET /fast HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = until_closed(&mut third).await;
        assert!(answer.ends_with("fast"), "{answer:?}");
        assert_eq!(until_closed(&mut idle).await, "", "the idle one was closed");

        release.notify_one();
        let answer = until_closed(&mut busy).await;
        assert!(answer.ends_with("slow done"), "{answer:?}");
        stop.cancel();
    }

    #[test]
    fn the_cap_leaves_a_reserve_and_splits_the_rest() {
        assert_eq!(connections_for(256), 64);
        assert_eq!(connections_for(1024), 384);
        assert_eq!(connections_for(65_536), MAX_CONNECTIONS);
        assert_eq!(connections_for(u64::MAX), MAX_CONNECTIONS);
        assert_eq!(connections_for(100), MIN_CONNECTIONS);
        for soft in [256u64, 1024, 4096, 20_000] {
            let both = 2 * connections_for(soft) as u64;
            assert!(both <= soft - MIN_RESERVE, "{soft}: {both}");
        }
    }
}
