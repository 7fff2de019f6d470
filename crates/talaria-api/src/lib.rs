//! The OpenAI-compatible HTTP server (spec: gateway §7.1).
//!
//! Any OpenAI client can talk to the agent through it: `POST
//! /v1/chat/completions` runs one agent turn (tools included) and answers
//! with a `chat.completion` object or, with `"stream": true`, a stream of
//! `chat.completion.chunk` server-sent events; `POST /v1/responses` does the
//! same in the shape of OpenAI's Responses API, whose responses are kept
//! for `GET`/`DELETE /v1/responses/{id}` and `previous_response_id`.
//!
//! # Layout
//!
//! - this file: [`ApiServerSettings`] (from config and environment),
//!   [`ApiServer`] (bind, serve, shut down), the router, `/health` and
//!   `/v1/models`.
//! - `auth`: the bearer-key check, compared in constant time.
//! - `error`: OpenAI-style error bodies.
//! - `session`: the session-id header, per-session locks, the index that
//!   lets a header-less client that resends its history continue its
//!   stored session, and opening (or creating and seeding) sessions.
//! - `chat`: `/v1/chat/completions`: request parsing, admission, the turn
//!   task and the non-streamed answer.
//! - `sse`: the streamed answer.
//! - `rest`: REST for sessions, cron jobs, pairing, capabilities, skills
//!   and toolsets, memory and the learning log, the configuration and the
//!   logs, `/health/detailed` and the OpenAPI description.
//! - `responses`: OpenAI's Responses API (`/v1/responses`): parsing, the
//!   `response` object, its event stream, and the responses kept in the
//!   store for retrieval and `previous_response_id`.
//! - `runs`: `/v1/runs` (asynchronous turns with a resumable event stream
//!   and approvals) and `/api/sessions/{id}/chat` and `/chat/stream`.
//!
//! [`ApiServer::routes`] hands the router to the dashboard
//! (`talaria-dashboard`), which calls it in-process with the key, and
//! [`ApiServer::merge`] serves the dashboard's pages beside it.
//!
//! # Invariants
//!
//! - A turn runs in its own task that owns a cancellation token; whoever
//!   waits for the answer (the request future, the SSE body) holds a guard
//!   that cancels the token when dropped, so a client that goes away
//!   interrupts its turn.
//! - Two turns never run at once on one session in this process: each
//!   request holds that session's lock from opening it to the end of the turn.
//! - Without the session header the model gets the conversation the client
//!   sent and nothing else: a request continues a stored session only when
//!   its earlier messages are that session's whole conversation, ending
//!   with our last answer, and no turn has run on it since; otherwise it
//!   gets a new session. The opening alone never picks a session.
//! - A response continues only the conversation of the response it names,
//!   as it stood at that response: never another client's, never a later
//!   turn's (`responses`).
//! - The API key is never logged.

mod auth;
mod chat;
mod config;
mod error;
mod metrics;
mod responses;
mod rest;
mod runs;
mod session;
mod sse;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use talaria_agent::Agent;
use talaria_core::{Env, Secret};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use self::error::ApiError;
use self::session::{SessionLocks, TranscriptIndex};
use talaria_platforms::listen::ConnectionLimits;

pub use config::{ApiServerConfig, ENV};
pub use rest::GatewayServices;

/// The port used when neither the config nor `API_SERVER_PORT` sets one.
pub const DEFAULT_PORT: u16 = 8642;

/// The host used when neither the config nor `API_SERVER_HOST` sets one:
/// loopback, so the server is not reachable from other machines by default.
pub const DEFAULT_HOST: &str = "127.0.0.1";

/// Shortest API key accepted. A short key can be guessed over the network.
pub const MIN_KEY_LEN: usize = 16;

/// Largest request body accepted; bigger requests get 413.
pub const MAX_BODY_BYTES: usize = 10 * 1024 * 1024;

/// Why the API server cannot be configured or started.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// Enabled, but no key in the config or `API_SERVER_KEY`.
    #[error(
        "the API server is enabled but has no key: set API_SERVER_KEY (or \
         platforms.api_server.key) to a random string of at least {MIN_KEY_LEN} characters, \
         or disable it with platforms.api_server.enabled: false"
    )]
    MissingKey,
    /// The key is too short to be safe on a network.
    #[error(
        "the API server key is {len} characters long; it must be at least {MIN_KEY_LEN} \
         (use a random string)"
    )]
    KeyTooShort {
        /// The length of the key that was refused, in characters.
        len: usize,
    },
    /// `API_SERVER_PORT` is not a port number.
    #[error("API_SERVER_PORT is `{0}`, which is not a port number (0-65535)")]
    InvalidPort(String),
    /// `API_SERVER_ENABLED` is neither true nor false.
    #[error("API_SERVER_ENABLED is `{0}`; use true or false")]
    InvalidEnabled(String),
    /// The address could not be bound (in use, not permitted, unknown host).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// `host:port` as configured.
        addr: String,
        /// What the operating system said.
        source: std::io::Error,
    },
}

/// How the API server is run, resolved from `platforms.api_server` and the
/// environment.
#[derive(Debug, Clone)]
pub struct ApiServerSettings {
    /// The interface to listen on (a name or an address).
    pub host: String,
    /// The TCP port; 0 picks a free one (see [`ApiServer::local_addr`]).
    pub port: u16,
    /// The bearer key every `/v1` request must carry.
    pub key: Secret,
    /// Turns allowed to run at once; more get 429. 0 means no cap.
    pub max_concurrent_runs: usize,
    /// How long a request waits for its session busy on another node.
    pub busy_wait: std::time::Duration,
}

impl ApiServerSettings {
    /// Resolves the settings, or `None` when the server is not enabled.
    ///
    /// Enabled when `enabled: true`, else when `API_SERVER_ENABLED` is
    /// true, else when a key is set (config `key` or `API_SERVER_KEY`); an
    /// explicit `enabled: false` always wins. Config values come before
    /// environment variables.
    ///
    /// # Errors
    /// When enabled without a key or with a key shorter than
    /// [`MIN_KEY_LEN`], or when `API_SERVER_PORT` / `API_SERVER_ENABLED`
    /// cannot be parsed.
    pub fn from_config(
        config: &ApiServerConfig,
        env: &Env,
    ) -> Result<Option<ApiServerSettings>, ApiServerError> {
        let key = config
            .key
            .as_ref()
            .filter(|k| !k.expose().trim().is_empty())
            .cloned()
            .or_else(|| env.get("API_SERVER_KEY").map(Secret::new));
        let enabled = match config.enabled {
            Some(explicit) => explicit,
            None => match env.get("API_SERVER_ENABLED") {
                Some(raw) => {
                    parse_bool(raw).ok_or_else(|| ApiServerError::InvalidEnabled(raw.to_owned()))?
                }
                None => key.is_some(),
            },
        };
        if !enabled {
            return Ok(None);
        }
        // Presented tokens are trimmed, so the key is compared trimmed too:
        // a stray space in `.env` must not turn every request into a 401.
        let key = Secret::new(key.ok_or(ApiServerError::MissingKey)?.expose().trim());
        let len = key.expose().chars().count();
        if len < MIN_KEY_LEN {
            return Err(ApiServerError::KeyTooShort { len });
        }
        let host = config
            .host
            .as_deref()
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .or_else(|| env.get("API_SERVER_HOST").map(str::trim))
            .unwrap_or(DEFAULT_HOST)
            .to_owned();
        let port = match (config.port, env.get("API_SERVER_PORT")) {
            (Some(p), _) => p,
            (None, Some(raw)) => raw
                .trim()
                .parse()
                .map_err(|_| ApiServerError::InvalidPort(raw.to_owned()))?,
            (None, None) => DEFAULT_PORT,
        };
        Ok(Some(ApiServerSettings {
            host,
            port,
            key,
            max_concurrent_runs: config.max_concurrent_runs,
            busy_wait: std::time::Duration::from_secs(config.busy_wait_secs.max(1)),
        }))
    }
}

fn parse_bool(raw: &str) -> Option<bool> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// What every handler shares.
pub(crate) struct AppState {
    pub(crate) agent: Arc<Agent>,
    pub(crate) key: Secret,
    /// `/metrics` is served without the key (`metrics.public` on a
    /// loopback listener).
    pub(crate) metrics_public: bool,
    /// How long a request waits for its session's turn lease.
    pub(crate) busy_wait: std::time::Duration,
    /// `None` when runs are not capped.
    pub(crate) runs: Option<Arc<Semaphore>>,
    /// Parent of every turn's token: cancelled when the server shuts down,
    /// so graceful shutdown is not held up by long turns or open streams.
    pub(crate) turns: CancellationToken,
    pub(crate) locks: SessionLocks,
    /// Which session a header-less conversation the client resends
    /// continues.
    pub(crate) index: TranscriptIndex,
    /// With a store shared by several nodes: a turn also holds its
    /// session's lease there, so two nodes never run one session at once.
    pub(crate) turn_leases: Option<talaria_gateway::turn_lease::TurnLeases>,
    /// How files in messages are taken (`image_url`, `input_audio`); unset
    /// refuses them.
    pub(crate) media: std::sync::OnceLock<Arc<talaria_gateway::media::MediaServices>>,
    /// Fetches images clients name by URL, through the URL guard (built
    /// on first use from `web:`).
    pub(crate) fetcher: std::sync::OnceLock<Result<talaria_web::Fetcher, String>>,
    /// Where turns' commands run: API clients are not the owner unless
    /// `gateway.owners.api_server` says `*`.
    pub(crate) backends: std::sync::OnceLock<Arc<talaria_exec::Backends>>,
    /// The gateway's parts for the jobs, pairing and health routes; unset
    /// they answer 503.
    pub(crate) gateway: std::sync::OnceLock<Arc<rest::GatewayServices>>,
    /// The Responses API's stored responses.
    pub(crate) responses: responses::ResponseStore,
    /// The asynchronous runs of `/v1/runs`, live and recently finished.
    pub(crate) run_registry: runs::Registry,
}

impl AppState {
    /// The bytes of an image a client named by URL, fetched through the
    /// URL guard (`web.allow_private`, `web.allow_hosts`) within the
    /// smaller of `web.max_bytes` and `media.max_bytes`.
    ///
    /// # Errors
    /// 400 `invalid_image_url` with the guard's or the fetch's sentence.
    pub(crate) async fn fetch_file(&self, url: &str) -> Result<Vec<u8>, error::ApiError> {
        let fetcher = self.fetcher.get_or_init(|| {
            let config = &self.agent.parts().config;
            let guard = talaria_web::UrlGuard::from_config(&config.web)?;
            let mut limits = talaria_web::Limits::from_config(&config.web);
            limits.max_bytes = limits.max_bytes.min(config.media.max_bytes);
            talaria_web::Fetcher::new(guard, limits).map_err(|e| e.to_string())
        });
        let fetcher = fetcher
            .as_ref()
            .map_err(|e| error::ApiError::internal(format!("Cannot fetch images: {e}")))?;
        let fetched = fetcher
            .get(url, "image/*", talaria_web::Oversize::Refuse)
            .await
            .map_err(|e| {
                error::ApiError::bad_request(format!("image_url: {e}"), "invalid_image_url")
            })?;
        Ok(fetched.body)
    }

    /// Where this server's turns run commands, and with what trust.
    pub(crate) async fn execution(&self, session_id: &str) -> talaria_agent::Execution {
        let parts = self.agent.parts();
        let backends = self.backends.get_or_init(|| {
            Arc::new(talaria_exec::Backends::new(
                &parts.config.terminal,
                &parts.home,
                parts.workdir.clone(),
            ))
        });
        let owner = parts
            .config
            .gateway
            .owners
            .get("api_server")
            .is_some_and(|o| o.iter().any(|id| id.trim() == "*"));
        let trust = if owner {
            talaria_exec::Trust::Owner
        } else {
            talaria_exec::Trust::Untrusted
        };
        talaria_agent::Execution::for_conversation(backends, trust, session_id).await
    }
}

/// A bound, not yet serving, API server.
pub struct ApiServer {
    listener: TcpListener,
    addr: SocketAddr,
    router: Router,
    turns: CancellationToken,
    limits: ConnectionLimits,
    state: Arc<AppState>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl ApiServer {
    /// Binds the listener now (so a busy port is reported before anything
    /// else starts, and port 0 gets its real number) and builds the routes.
    ///
    /// # Errors
    /// [`ApiServerError::Bind`] when the address cannot be bound.
    pub async fn bind(
        settings: ApiServerSettings,
        agent: Arc<Agent>,
    ) -> Result<ApiServer, ApiServerError> {
        ApiServer::bind_with(settings, agent, None).await
    }

    /// [`ApiServer::bind`] for a node of a deployment sharing its store:
    /// each turn waits for, and holds, its session's turn lease.
    pub async fn bind_with(
        settings: ApiServerSettings,
        agent: Arc<Agent>,
        turn_leases: Option<talaria_gateway::turn_lease::TurnLeases>,
    ) -> Result<ApiServer, ApiServerError> {
        let (listener, addr) =
            talaria_platforms::listen::bind_listener(&settings.host, settings.port)
                .await
                .map_err(|(addr, source)| ApiServerError::Bind { addr, source })?;
        let turns = CancellationToken::new();
        let metrics_public = agent.parts().config.metrics.public;
        if metrics_public && !addr.ip().is_loopback() {
            tracing::warn!(
                %addr,
                "metrics.public is honoured on loopback only: /metrics keeps asking for the key"
            );
        }
        let state = Arc::new(AppState {
            metrics_public: metrics_public && addr.ip().is_loopback(),
            busy_wait: settings.busy_wait,
            agent,
            key: settings.key,
            runs: (settings.max_concurrent_runs > 0)
                .then(|| Arc::new(Semaphore::new(settings.max_concurrent_runs))),
            turns: turns.clone(),
            locks: SessionLocks::default(),
            index: TranscriptIndex::default(),
            turn_leases,
            media: std::sync::OnceLock::new(),
            fetcher: std::sync::OnceLock::new(),
            backends: std::sync::OnceLock::new(),
            gateway: std::sync::OnceLock::new(),
            responses: responses::ResponseStore::default(),
            run_registry: runs::Registry::default(),
        });
        Ok(ApiServer {
            listener,
            addr,
            router: router(state.clone()),
            turns,
            limits: ConnectionLimits::for_this_process(),
            state,
        })
    }

    /// Keeps the index of header-less conversations in `store` (the
    /// gateway's store), so a client that resends its history continues
    /// the stored session after a restart and on every node of a shared
    /// store. Without it each header-less request gets a session of its
    /// own. The Responses API keeps its responses there too; without it
    /// none is kept.
    pub fn with_transcript_store(self, store: Arc<dyn talaria_store::CursorStore>) -> ApiServer {
        self.state.responses.attach(store.clone());
        // Turn leases exist exactly when several nodes share the store.
        let shared = self.state.turn_leases.is_some();
        self.state.index.attach(store, shared);
        self
    }

    /// Takes files in messages (`image_url` data URLs, `input_audio`)
    /// through these media services: the media cache, speech to text, the
    /// vision setting. Without them such messages are refused.
    pub fn with_media(self, media: Arc<talaria_gateway::media::MediaServices>) -> ApiServer {
        let _ = self.state.media.set(media);
        self
    }

    /// Runs commands through these backends (the gateway's, shared), not
    /// a set of its own.
    pub fn with_backends(self, backends: Arc<talaria_exec::Backends>) -> ApiServer {
        let _ = self.state.backends.set(backends);
        self
    }

    /// Serves cron jobs, pairing and the detailed health report from the
    /// gateway this server runs beside.
    pub fn with_gateway(self, gateway: rest::GatewayServices) -> ApiServer {
        let _ = self.state.gateway.set(Arc::new(gateway));
        self
    }

    /// The API's routes as they are served (behind the key), for a
    /// client in this process: the dashboard calls them with the key, so
    /// it can do nothing the API cannot.
    pub fn routes(&self) -> Router {
        self.router.clone()
    }

    /// Serves `extra` (the dashboard's routes) on this server's port
    /// beside the API's; paths the API has are not to be in it.
    pub fn merge(&mut self, extra: Router) {
        self.router = self.router.clone().merge(extra);
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

    /// Serves (within the connection limits, see [`crate::listen`]) until
    /// `shutdown` is cancelled, then interrupts running turns, stops
    /// accepting connections and waits for open responses to finish.
    ///
    /// # Errors
    /// Only when the listener itself fails.
    pub async fn serve(self, shutdown: CancellationToken) -> std::io::Result<()> {
        let turns = self.turns;
        let state = self.state;
        // Its own token: a listener that fails stops the saving too.
        let stop_saving = shutdown.child_token();
        let saving = {
            let (state, stop) = (state.clone(), stop_saving.clone());
            tokio::spawn(async move { state.index.save_until(stop).await })
        };
        let app = self
            .router
            .layer(axum::middleware::from_fn(refuse_declared_too_large));
        let served = talaria_platforms::listen::serve(
            "API server",
            self.listener,
            app,
            self.limits,
            async move {
                shutdown.cancelled().await;
                turns.cancel();
            },
        )
        .await;
        // The answers are sent: what is left of the index goes to the
        // store, so a client continues its conversation after a restart.
        stop_saving.cancel();
        let _ = saving.await;
        state.index.save().await;
        served
    }
}

/// 413 for a request whose `Content-Length` declares more than
/// [`MAX_BODY_BYTES`], before any of the body is read: the routes' body
/// limit only finds out after reading that much, and a client declaring
/// 100 MB and sending nothing would hold the request until the body
/// timeout.
async fn refuse_declared_too_large(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return ApiError::too_large(MAX_BODY_BYTES).into_response();
    }
    next.run(request).await
}

fn router(state: Arc<AppState>) -> Router {
    let protected = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .merge(rest::routes())
        .merge(responses::routes())
        .merge(runs::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ));
    Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics::scrape))
        .route("/readyz", get(readyz))
        .merge(protected)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

async fn health() -> Response {
    axum::Json(json!({
        "status": "ok",
        "platform": "talaria",
        "version": env!("CARGO_PKG_VERSION"),
    }))
    .into_response()
}

/// `GET /readyz`: 200 once every platform the gateway runs is connected,
/// or held by another node of a shared store (that node serves it; this
/// one takes over if it dies), else 503 naming those still connecting.
/// A server without a gateway beside it is ready as soon as it listens.
async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    use talaria_gateway::adapter::Liveness;
    let waiting: Vec<String> = match state.gateway.get() {
        Some(gateway) => {
            let states = gateway.board.snapshot();
            gateway
                .platforms
                .iter()
                .filter(|p| {
                    !states
                        .get(p.as_str())
                        .is_some_and(|s| matches!(s.liveness, Liveness::Live | Liveness::Standby))
                })
                .cloned()
                .collect()
        }
        None => Vec::new(),
    };
    let status = if waiting.is_empty() {
        axum::http::StatusCode::OK
    } else {
        axum::http::StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(json!({"ready": waiting.is_empty(), "waiting": waiting})),
    )
        .into_response()
}

/// A model the server answers with, as OpenAI describes a model.
fn model_object(id: &str) -> serde_json::Value {
    json!({
        "id": id,
        "object": "model",
        "created": chat::unix_now(),
        "owned_by": "talaria",
    })
}

/// What `/v1/models` lists: the default model, then the names of
/// `model.routes`, as the ancestor lists its route aliases.
fn model_ids(state: &AppState) -> Vec<String> {
    let mut ids = vec![state.agent.parts().provider.model().to_owned()];
    for name in state.agent.parts().config.model.routes.keys() {
        if !ids.contains(name) {
            ids.push(name.clone());
        }
    }
    ids
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    let data: Vec<serde_json::Value> = model_ids(&state)
        .iter()
        .map(|id| model_object(id))
        .collect();
    axum::Json(json!({
        "object": "list",
        "data": data,
    }))
    .into_response()
}

/// `GET /v1/models/{id}`: the model when `id` is one listed, else 404
/// with OpenAI's `model_not_found`.
async fn model(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    if model_ids(&state).contains(&id) {
        axum::Json(model_object(&id)).into_response()
    } else {
        ApiError::model_not_found(&id).into_response()
    }
}

async fn not_found() -> Response {
    ApiError::not_found().into_response()
}
