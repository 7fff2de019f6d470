//! The shared HTTP listener of the platforms that deliver by webhook: the
//! generic signed webhooks, and chat platforms such as WhatsApp Cloud,
//! Twilio SMS and Home Assistant.
//!
//! One port (`platforms.webhook.host`/`port`, 8644 by default) serves them
//! all, each under its own path prefix and each checking its own
//! signatures, so an operator exposes one endpoint behind one reverse
//! proxy whatever mix of platforms is on.
//!
//! The listener and the adapters have separate lives: the listener is
//! bound at startup and serves until the gateway stops, while each
//! adapter's [`Adapter::run`](talaria_adapter::Adapter::run) only
//! [attaches](InboxSlot::attach) the inbox of that run to the platform's
//! [`InboxSlot`]. A handler finds its inbox there; while none is attached
//! (before the gateway's runner started, or while it stops) it answers 503,
//! which every webhook sender retries.
//!
//! # Invariants
//!
//! - `GET /health` answers 200 only while every mounted platform has an
//!   inbox attached, so "healthy" means deliveries would be taken.
//! - Each platform mounts routes under a prefix of its own; axum refuses
//!   overlapping routes when they are merged, at startup.
//! - Connections are served within the timeouts and the connection cap of
//!   [`crate::listen`]; each platform's handler refuses a body declared
//!   larger than its own limit (413) before reading any of it.

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::Body;
use axum::http::header::CONTENT_LENGTH;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use serde_json::json;
use talaria_adapter::{AdapterContext, AdapterError, Inbox, Liveness};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::listen::ConnectionLimits;

/// The port used when the config sets none.
pub const DEFAULT_PORT: u16 = 8644;

/// The host used when the config sets none: loopback, so deliveries reach
/// it only through a reverse proxy the operator set up.
pub const DEFAULT_HOST: &str = "127.0.0.1";

/// The shared listener could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {source}")]
pub struct BindError {
    /// `host:port` as configured.
    pub addr: String,
    /// What the operating system said.
    pub source: std::io::Error,
}

/// Where a webhook platform's handlers find the inbox of the adapter's
/// current run. Cloning shares the slot.
#[derive(Clone, Default)]
pub struct InboxSlot {
    current: Arc<RwLock<Option<Inbox>>>,
}

impl fmt::Debug for InboxSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxSlot")
            .field("attached", &self.inbox().is_some())
            .finish()
    }
}

impl InboxSlot {
    /// An empty slot.
    pub fn new() -> InboxSlot {
        InboxSlot::default()
    }

    /// The inbox of the running adapter, if one is attached.
    pub fn inbox(&self) -> Option<Inbox> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The whole of a webhook adapter's `run`: attaches `ctx.inbox`, reports
    /// the adapter live, and detaches again when the gateway stops.
    /// Deliveries arrive through the shared listener meanwhile.
    pub async fn attach(&self, ctx: &AdapterContext) -> Result<(), AdapterError> {
        self.set(Some(ctx.inbox.clone()));
        ctx.liveness.set(Liveness::Live);
        ctx.shutdown.cancelled().await;
        self.set(None);
        Ok(())
    }

    fn set(&self, inbox: Option<Inbox>) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = inbox;
    }
}

/// What a platform serves on the shared listener: its routes, under a
/// path prefix of its own, and the slot their handlers take the inbox from.
pub struct Mount {
    /// The platform's name, for `/health` and logs.
    pub platform: &'static str,
    /// The slot the adapter's `run` attaches its inbox to.
    pub slot: InboxSlot,
    /// The routes, all under the platform's own prefix.
    pub routes: Router,
}

impl fmt::Debug for Mount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mount")
            .field("platform", &self.platform)
            .finish_non_exhaustive()
    }
}

/// The bound listener and the routes mounted on it (see the module docs).
pub struct Ingress {
    listener: TcpListener,
    addr: SocketAddr,
    limits: ConnectionLimits,
    router: Router,
    /// Every mounted platform and its slot, for `/health`.
    platforms: Vec<(&'static str, InboxSlot)>,
}

impl fmt::Debug for Ingress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ingress")
            .field("addr", &self.addr)
            .field("platforms", &self.platform_names())
            .finish_non_exhaustive()
    }
}

impl Ingress {
    /// Binds `host:port` now, so a busy port stops the gateway at startup
    /// (and port 0 gets its real number). A host that is not loopback is
    /// allowed but warned about.
    ///
    /// # Errors
    /// [`BindError`] with what the operating system said.
    pub async fn bind(host: &str, port: u16) -> Result<Ingress, BindError> {
        if !crate::net::is_loopback(host) {
            tracing::warn!(
                %host,
                "the webhook listener is reachable beyond this machine; prefer 127.0.0.1 behind \
                 a reverse proxy with TLS"
            );
        }
        let (listener, addr) = crate::listen::bind_listener(host, port)
            .await
            .map_err(|(addr, source)| BindError { addr, source })?;
        Ok(Ingress {
            listener,
            addr,
            limits: ConnectionLimits::for_this_process(),
            router: Router::new(),
            platforms: Vec::new(),
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The limits the connections are served within.
    pub fn connection_limits(&self) -> ConnectionLimits {
        self.limits
    }

    /// Serves connections within `limits` instead of the defaults (the
    /// configured timeouts, say).
    pub fn set_connection_limits(&mut self, limits: ConnectionLimits) {
        self.limits = limits;
    }

    /// The platforms mounted so far.
    pub fn platform_names(&self) -> Vec<&'static str> {
        self.platforms.iter().map(|(name, _)| *name).collect()
    }

    /// Adds a platform's routes.
    ///
    /// # Panics
    /// When a route overlaps one already mounted: each platform's prefix
    /// is fixed in code, so this is a programming error found at startup.
    pub fn mount(&mut self, mount: Mount) {
        let router = std::mem::take(&mut self.router);
        self.router = router.merge(mount.routes);
        self.platforms.push((mount.platform, mount.slot));
    }

    /// Serves (within the connection limits, see [`crate::listen`]) until
    /// `shutdown` fires, then finishes the requests in flight.
    ///
    /// # Errors
    /// What the server failed with before `shutdown`.
    pub async fn serve(self, shutdown: CancellationToken) -> std::io::Result<()> {
        let health = {
            let platforms = Arc::new(self.platforms);
            get(move || health(platforms.clone()))
        };
        let app = self.router.route("/health", health).fallback(not_found);
        crate::listen::serve(
            "webhook listener",
            self.listener,
            app,
            self.limits,
            async move {
                shutdown.cancelled().await;
            },
        )
        .await
    }
}

/// Why a delivery's body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyError {
    /// Declared or found to be larger than the limit, in bytes.
    TooLarge(usize),
    /// The connection broke off before the body was complete.
    Broken,
}

impl BodyError {
    /// The status a handler answers with: 413, or 400 for a broken body.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::Broken => StatusCode::BAD_REQUEST,
        }
    }
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::TooLarge(limit) => write!(f, "the body is larger than {limit} bytes"),
            BodyError::Broken => f.write_str("the body could not be read"),
        }
    }
}

/// A delivery's whole body, or [`BodyError::TooLarge`] as soon as it is
/// known to be over `limit`: from `Content-Length` before anything is read,
/// else once more than that arrived. No more than `limit` bytes are ever
/// held, whatever a sender claims or streams.
pub(crate) async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > u64::try_from(limit).unwrap_or(u64::MAX)) {
        return Err(BodyError::TooLarge(limit));
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        // `to_bytes` fails with either the body's own error (an
        // `axum::Error`: the connection broke) or its length-limit error,
        // whose type axum does not export; so whatever is not the body's
        // error is the limit.
        if e.into_inner().is::<axum::Error>() {
            BodyError::Broken
        } else {
            BodyError::TooLarge(limit)
        }
    })
}

/// A JSON refusal, `{"error": message}`, as the JSON-speaking webhook
/// platforms answer.
pub(crate) fn json_refusal(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

async fn health(platforms: Arc<Vec<(&'static str, InboxSlot)>>) -> Response {
    let waiting: Vec<&str> = platforms
        .iter()
        .filter(|(_, slot)| slot.inbox().is_none())
        .map(|(name, _)| *name)
        .collect();
    let names: Vec<&str> = platforms.iter().map(|(name, _)| *name).collect();
    if waiting.is_empty() {
        axum::Json(json!({"status": "ok", "platforms": names})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "starting", "platforms": names, "waiting": waiting})),
        )
            .into_response()
    }
}

async fn not_found() -> Response {
    json_refusal(StatusCode::NOT_FOUND, "not found")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use talaria_adapter::LivenessReporter;

    #[tokio::test]
    async fn bodies_are_read_up_to_the_limit() {
        let streamed = |chunks: Vec<Result<&'static [u8], std::io::Error>>| {
            Body::from_stream(futures::stream::iter(chunks))
        };
        let ok = read_body(streamed(vec![Ok(b"ab"), Ok(b"cd")]), &HeaderMap::new(), 4).await;
        assert_eq!(ok.ok().as_deref(), Some(&b"abcd"[..]));
        let over = read_body(streamed(vec![Ok(b"ab"), Ok(b"cde")]), &HeaderMap::new(), 4).await;
        assert_eq!(over.unwrap_err(), BodyError::TooLarge(4));
        let broken = streamed(vec![Ok(b"ab"), Err(std::io::Error::other("reset"))]);
        let broken = read_body(broken, &HeaderMap::new(), 4).await.unwrap_err();
        assert_eq!(broken, BodyError::Broken);
        assert_eq!(broken.status(), StatusCode::BAD_REQUEST);
        // A declared length over the limit is refused before reading.
        let mut declared = HeaderMap::new();
        declared.insert(CONTENT_LENGTH, "5".parse().unwrap());
        let early = read_body(streamed(vec![Ok(b"ab")]), &declared, 4)
            .await
            .unwrap_err();
        assert_eq!(early, BodyError::TooLarge(4));
        assert_eq!(early.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(early.to_string(), "the body is larger than 4 bytes");
    }

    #[tokio::test]
    async fn health_waits_for_every_platform_and_routes_reach_their_handlers() {
        let mut ingress = Ingress::bind("127.0.0.1", 0).await.unwrap();
        let addr = ingress.local_addr();
        let (a, b) = (InboxSlot::new(), InboxSlot::new());
        for (platform, slot, path, answer) in [("a", &a, "/a/x", "A"), ("b", &b, "/b/x", "B")] {
            ingress.mount(Mount {
                platform,
                slot: slot.clone(),
                routes: Router::new().route(path, post(move || async move { answer })),
            });
        }
        let stop = CancellationToken::new();
        let server = tokio::spawn(ingress.serve(stop.clone()));
        let http = reqwest::Client::new();
        let get = |path: &'static str| {
            let http = http.clone();
            async move {
                let r = http
                    .get(format!("http://{addr}{path}"))
                    .send()
                    .await
                    .unwrap();
                (r.status().as_u16(), r.text().await.unwrap())
            }
        };

        let (status, body) = get("/health").await;
        assert_eq!(status, 503);
        assert!(body.contains(r#""waiting":["a","b"]"#), "{body}");

        let (inbox, _rx) = Inbox::channel(1);
        let (liveness, seen) = LivenessReporter::new();
        let run_stop = CancellationToken::new();
        let ctx = AdapterContext {
            inbox,
            liveness,
            shutdown: run_stop.clone(),
        };
        let slot = a.clone();
        let run = tokio::spawn(async move { slot.attach(&ctx).await });
        b.set(Some(Inbox::channel(1).0));
        let mut seen = seen;
        seen.wait_for(|l| *l == Liveness::Live).await.unwrap();
        assert_eq!(get("/health").await.0, 200);

        let r = http
            .post(format!("http://{addr}/b/x"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.text().await.unwrap(), "B");
        assert_eq!(get("/nowhere").await.0, 404);

        run_stop.cancel();
        run.await.unwrap().unwrap();
        assert!(a.inbox().is_none(), "a stopped run leaves its slot empty");
        assert_eq!(get("/health").await.0, 503);
        stop.cancel();
        server.await.unwrap().unwrap();
    }
}
