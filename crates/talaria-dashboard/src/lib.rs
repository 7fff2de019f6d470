//! The web dashboard: what `talaria gateway status`, `sessions`, `cron`,
//! `pairing`, `skills`, `memory`, `config` and the logs show, and a chat,
//! in a browser.
//!
//! The dashboard is the API server's first client and uses nothing the
//! API does not offer: every page is rendered on the server from the
//! answers of the API's own routes, called in-process with the API key
//! (`api`), and the browser's script talks to the same routes through
//! `/ui/api/...`, which checks the login and forwards. What it adds is a
//! login, pages, and the protections a browser needs.
//!
//! # Layout
//!
//! - this file: [`Dashboard`] (its routes under `/ui`) and the headers
//!   every answer carries.
//! - `settings`: [`DashboardSettings`] from `dashboard:`, and
//!   [`hash_password`].
//! - `auth`: logging in (the API key or the password), logins kept in the
//!   store, the session cookie and the CSRF token, the guard in front of
//!   every page.
//! - `api`: the in-process client of the API's router, and the
//!   `/ui/api/...` pass-through.
//! - `form`: reading form posts.
//! - `view`: what templates share: the frame (navigation, the CSRF
//!   token, the flash message), times and sizes in words.
//! - `pages`: one module per page.
//! - `assets`: the stylesheet and the script, embedded.
//!
//! # Invariants
//!
//! - Nothing under `/ui` but the login page and the assets answers
//!   without a login; every request that changes something also carries
//!   the login's CSRF token, and its `Origin`, when sent, is this host.
//! - Everything a chat or a client wrote reaches the page escaped (the
//!   templates escape by default; nothing of theirs is marked safe), and
//!   the content security policy allows only the dashboard's own script,
//!   so a transcript cannot run code in the operator's browser.
//! - The API key never reaches the browser: the cookie is a random token
//!   whose hash names a login in the store.
#![forbid(unsafe_code)]

mod api;
mod assets;
mod auth;
mod form;
mod pages;
mod settings;
mod view;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{any, get, post};
use talaria_core::Secret;
use talaria_store::CursorStore;

pub use settings::{DashboardSettings, SettingsError, hash_password};

/// What every page handler shares.
pub(crate) struct Ui {
    pub(crate) api: api::Api,
    pub(crate) auth: auth::Auth,
}

/// The dashboard's routes, ready to be served beside the API or on their
/// own listener.
pub struct Dashboard {
    ui: Arc<Ui>,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard").finish_non_exhaustive()
    }
}

impl Dashboard {
    /// A dashboard over `api` (the API server's router, which it calls
    /// in-process with `key`), keeping logins in `logins` (the gateway's
    /// store, so every node of a shared store knows them).
    pub fn new(
        settings: DashboardSettings,
        api: Router,
        key: Secret,
        logins: Arc<dyn CursorStore>,
    ) -> Dashboard {
        let auth = auth::Auth::new(&settings, key.clone(), logins);
        Dashboard {
            ui: Arc::new(Ui {
                api: api::Api::new(api, key),
                auth,
            }),
        }
    }

    /// The routes, all under `/ui`.
    pub fn router(&self) -> Router {
        let guarded = Router::new()
            .route("/ui/", get(pages::overview::page))
            .route("/ui/sessions", get(pages::sessions::list))
            .route("/ui/sessions/{id}", get(pages::sessions::transcript))
            .route("/ui/sessions/{id}/rename", post(pages::sessions::rename))
            .route("/ui/sessions/{id}/delete", post(pages::sessions::delete))
            .route("/ui/chat", get(pages::chat::page))
            .route("/ui/pairing", get(pages::pairing::page))
            .route("/ui/pairing/{action}", post(pages::pairing::act))
            .route("/ui/cron", get(pages::cron::page).post(pages::cron::create))
            .route("/ui/cron/{id}/{action}", post(pages::cron::act))
            .route(
                "/ui/memory",
                get(pages::memory::page).post(pages::memory::change),
            )
            .route("/ui/skills", get(pages::skills::list))
            .route(
                "/ui/skills/{name}",
                get(pages::skills::show).post(pages::skills::save),
            )
            .route("/ui/learning", get(pages::learning::page))
            .route("/ui/learning/rollback", post(pages::learning::rollback))
            .route("/ui/graph", get(pages::graph::page))
            .route("/ui/config", get(pages::config::page))
            .route("/ui/logs", get(pages::logs::page))
            .route("/ui/logout", post(auth::logout))
            .route("/ui/api/{*path}", any(api::pass_through))
            .route_layer(axum::middleware::from_fn_with_state(
                self.ui.clone(),
                auth::guard,
            ));
        Router::new()
            .route("/ui", get(pages::to_overview))
            .route("/ui/login", get(auth::login_page).post(auth::login))
            .route("/ui/assets/{name}", get(assets::serve))
            .merge(guarded)
            .layer(axum::middleware::from_fn(protective_headers))
            .with_state(self.ui.clone())
    }
}

/// Headers on every answer of the dashboard: only its own script and
/// styles may run or load, it may not be framed, nothing is cached (pages
/// hold conversations) and no referrer leaves for another site.
async fn protective_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let fixed: [(HeaderName, &str); 6] = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
             frame-ancestors 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // Not `no-referrer`: under it Chromium sends `Origin: null` with
        // form posts, which the origin check must refuse.
        (header::REFERRER_POLICY, "same-origin"),
        (
            HeaderName::from_static("cross-origin-opener-policy"),
            "same-origin",
        ),
        (
            HeaderName::from_static("cross-origin-resource-policy"),
            "same-origin",
        ),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
