//! Logging in and the guard in front of every page.
//!
//! A login is a random token in an HttpOnly, SameSite=Strict cookie; the
//! store keeps only the token's SHA-256 (as a cursor of the namespace
//! [`LOGINS`]), with its expiry and its CSRF token, so a login made on
//! one node of a shared store is known to all of them, and logging out
//! ends it everywhere.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::password_hash::{PasswordHash, PasswordVerifier};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use talaria_core::Secret;
use talaria_store::CursorStore;

use crate::settings::DashboardSettings;
use crate::view;
use crate::{Ui, form};

/// The cursor namespace logins are kept in.
const LOGINS: &str = "dashboard_logins";

/// The session cookie's name.
pub(crate) const COOKIE: &str = "talaria_session";

/// Failed logins allowed per minute (all clients together) before
/// further attempts are refused without being checked.
const MAX_FAILURES_PER_MINUTE: usize = 10;

/// Largest login form read.
const MAX_LOGIN_FORM: usize = 8 * 1024;

/// Largest form a guarded page reads to find its CSRF token (a skill's
/// text is the biggest thing posted).
pub(crate) const MAX_FORM_BYTES: usize = 2 * 1024 * 1024;

/// A login as the store keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    csrf: String,
    expires_at: f64,
}

/// The login a guarded request was made with, for its handler.
#[derive(Debug, Clone)]
pub(crate) struct Login {
    /// The token forms and scripts must send back with every change.
    pub(crate) csrf: String,
}

/// Who may log in, and the logins.
pub(crate) struct Auth {
    key: Secret,
    password_hash: Option<Secret>,
    ttl: Duration,
    logins: Arc<dyn CursorStore>,
    failures: Mutex<VecDeque<Instant>>,
}

impl Auth {
    pub(crate) fn new(
        settings: &DashboardSettings,
        key: Secret,
        logins: Arc<dyn CursorStore>,
    ) -> Auth {
        Auth {
            key,
            password_hash: settings.password_hash.clone(),
            ttl: settings.session_ttl,
            logins,
            failures: Mutex::new(VecDeque::new()),
        }
    }

    /// Whether too many logins failed in the last minute.
    fn throttled(&self) -> bool {
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while failures
            .front()
            .is_some_and(|t| t.elapsed() > Duration::from_secs(60))
        {
            failures.pop_front();
        }
        failures.len() >= MAX_FAILURES_PER_MINUTE
    }

    fn failed(&self) {
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        failures.push_back(Instant::now());
        while failures.len() > MAX_FAILURES_PER_MINUTE {
            failures.pop_front();
        }
    }

    /// Whether `secret` is the API key or the dashboard's password.
    async fn accepts(&self, secret: &str) -> bool {
        let secret = secret.trim();
        if talaria_core::constant_time_eq(secret.as_bytes(), self.key.expose().as_bytes()) {
            return true;
        }
        let Some(hash) = self.password_hash.clone() else {
            return false;
        };
        let secret = secret.to_owned();
        // Argon2 takes tens of milliseconds of CPU on purpose: off the
        // async threads.
        tokio::task::spawn_blocking(move || {
            PasswordHash::new(hash.expose()).is_ok_and(|parsed| {
                argon2::Argon2::default()
                    .verify_password(secret.as_bytes(), &parsed)
                    .is_ok()
            })
        })
        .await
        .unwrap_or(false)
    }

    /// Starts a login: its token (for the cookie) and its CSRF token.
    async fn start(&self) -> Result<String, talaria_store::StoreError> {
        let token = random_hex();
        let stored = Stored {
            csrf: random_hex(),
            expires_at: talaria_core::unix_now() + self.ttl.as_secs_f64(),
        };
        let value = serde_json::to_string(&stored).unwrap_or_default();
        self.logins
            .set_cursor(LOGINS, &token_key(&token), &value)
            .await?;
        Ok(token)
    }

    /// The login `token` names, if it has not expired.
    async fn find(&self, token: &str) -> Option<Login> {
        let key = token_key(token);
        let value = match self.logins.cursor(LOGINS, &key).await {
            Ok(v) => v?,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read dashboard logins");
                return None;
            }
        };
        let stored: Stored = serde_json::from_str(&value).ok()?;
        if stored.expires_at <= talaria_core::unix_now() {
            let _ = self.logins.delete_cursor(LOGINS, &key).await;
            return None;
        }
        Some(Login { csrf: stored.csrf })
    }

    async fn end(&self, token: &str) {
        if let Err(e) = self.logins.delete_cursor(LOGINS, &token_key(token)).await {
            tracing::warn!(error = %e, "cannot end a dashboard login");
        }
    }
}

/// 32 random bytes as hex.
fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    talaria_core::ids::to_hex(&bytes)
}

/// What the store keeps a token under: its hash, so reading the store
/// does not give a working cookie.
fn token_key(token: &str) -> String {
    talaria_core::ids::to_hex(&Sha256::digest(token.as_bytes()))
}

/// The value of cookie `name` in the request's headers.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.trim())
}

/// Whether the page was asked for over HTTPS (through a proxy that says
/// so), so cookies are marked `Secure`.
pub(crate) fn over_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// A `Set-Cookie` value for the dashboard's paths.
pub(crate) fn set_cookie(name: &str, value: &str, max_age: u64, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Whether a request that changes something came from a page of this
/// host: a browser sends `Origin` on such requests, and it must name the
/// host the request was sent to. Without `Origin` (an old browser, a
/// script) the CSRF token alone decides.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let origin_host = origin
        .split_once("://")
        .map_or(origin, |(_, rest)| rest)
        .trim_end_matches('/');
    origin_host.eq_ignore_ascii_case(host)
}

/// `GET /ui/login`, with `next` (where to go after) kept in the form.
pub(crate) async fn login_page(
    query: Result<axum::extract::Query<form::Query>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let next = query
        .ok()
        .and_then(|q| q.0.get("next").cloned())
        .filter(|n| is_dashboard_path(n));
    view::login_page(StatusCode::OK, None, next.as_deref())
}

/// `POST /ui/login` with `secret` (the API key or the password) and,
/// optionally, `next` (a dashboard path to go to).
pub(crate) async fn login(State(ui): State<Arc<Ui>>, request: Request) -> Response {
    let headers = request.headers().clone();
    if !same_origin(&headers) {
        return refused(
            StatusCode::FORBIDDEN,
            "This login did not come from this dashboard.",
        );
    }
    let fields = match form::read(request.into_body(), MAX_LOGIN_FORM).await {
        Ok(fields) => fields,
        Err(e) => return e.into_response(),
    };
    if ui.auth.throttled() {
        tracing::warn!("dashboard login refused: too many failed logins in the last minute");
        return view::login_page(
            StatusCode::TOO_MANY_REQUESTS,
            Some("Too many failed logins in the last minute; wait a minute and try again."),
            None,
        );
    }
    let secret = fields.get("secret").unwrap_or_default();
    if !ui.auth.accepts(secret).await {
        ui.auth.failed();
        tracing::info!("dashboard login failed");
        return view::login_page(
            StatusCode::UNAUTHORIZED,
            Some("That is neither the API key nor the password."),
            fields.get("next").filter(|n| is_dashboard_path(n)),
        );
    }
    let token = match ui.auth.start().await {
        Ok(token) => token,
        Err(e) => {
            tracing::warn!(error = %e, "cannot store a dashboard login");
            return view::login_page(
                StatusCode::SERVICE_UNAVAILABLE,
                Some(&format!("Cannot log in: the store failed ({e})")),
                None,
            );
        }
    };
    let next = fields
        .get("next")
        .filter(|n| is_dashboard_path(n))
        .unwrap_or("/ui/");
    let mut response = Redirect::to(next).into_response();
    response.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(COOKIE, &token, ui.auth.ttl.as_secs(), over_https(&headers)),
    );
    response
}

/// Whether `path` is a page of the dashboard (not another site, not a
/// scheme), so a login may go on to it.
fn is_dashboard_path(path: &str) -> bool {
    path.starts_with("/ui/")
        && !path.starts_with("/ui//")
        && !path.contains('\\')
        && path.chars().all(|c| !c.is_control())
}

/// `POST /ui/logout`: ends the login everywhere and clears the cookie.
pub(crate) async fn logout(State(ui): State<Arc<Ui>>, headers: HeaderMap) -> Response {
    if let Some(token) = cookie(&headers, COOKIE) {
        ui.auth.end(token).await;
    }
    let mut response = Redirect::to("/ui/login").into_response();
    response.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(COOKIE, "", 0, over_https(&headers)),
    );
    response
}

/// A refusal in words, as plain text.
fn refused(status: StatusCode, why: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        why.to_owned(),
    )
        .into_response()
}

/// In front of every page but the login: a login is required (pages
/// redirect to the login form, the API pass-through answers 401), and a
/// request that changes something must carry the login's CSRF token (the
/// `x-csrf-token` header, or a form's `csrf` field) and come from this
/// host.
pub(crate) async fn guard(State(ui): State<Arc<Ui>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let path = request.uri().path().to_owned();
    let is_api = path.starts_with("/ui/api/");
    let login = match cookie(headers, COOKIE) {
        Some(token) => ui.auth.find(token).await,
        None => None,
    };
    let Some(login) = login else {
        if is_api {
            return refused(StatusCode::UNAUTHORIZED, "Log in to the dashboard first.");
        }
        if request.method() == Method::GET || request.method() == Method::HEAD {
            let target = request
                .uri()
                .path_and_query()
                .map_or("/ui/", |p| p.as_str())
                .to_owned();
            let next: String = form_urlencoded::byte_serialize(target.as_bytes()).collect();
            return Redirect::to(&format!("/ui/login?next={next}")).into_response();
        }
        return refused(StatusCode::UNAUTHORIZED, "Log in to the dashboard first.");
    };
    let safe = matches!(*request.method(), Method::GET | Method::HEAD);
    if safe {
        let mut request = request;
        request.extensions_mut().insert(login);
        return next.run(request).await;
    }
    if !same_origin(headers) {
        return refused(
            StatusCode::FORBIDDEN,
            "This request did not come from this dashboard.",
        );
    }
    let header_token = headers
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (parts, body) = request.into_parts();
    let (presented, body) = match header_token {
        Some(token) => (Some(token), body),
        None if form::is_form(&parts.headers) => {
            let bytes = match axum::body::to_bytes(body, MAX_FORM_BYTES).await {
                Ok(bytes) => bytes,
                Err(_) => {
                    return refused(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "The form is too large for the dashboard.",
                    );
                }
            };
            let token = form::Fields::parse(&bytes).get("csrf").map(str::to_owned);
            (token, Body::from(bytes))
        }
        None => (None, body),
    };
    let matches = presented.is_some_and(|t| {
        talaria_core::constant_time_eq(t.trim().as_bytes(), login.csrf.as_bytes())
    });
    if !matches {
        tracing::info!(%path, "dashboard request refused: missing or wrong CSRF token");
        return refused(
            StatusCode::FORBIDDEN,
            "This change did not carry the page's CSRF token; reload the page and try again.",
        );
    }
    let mut request = Request::from_parts(parts, body);
    request.extensions_mut().insert(login);
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_dashboard_paths_are_followed_after_login() {
        assert!(is_dashboard_path("/ui/sessions?q=x"));
        for bad in [
            "https://evil.example/ui/",
            "//evil.example/",
            "/ui//evil.example",
            "/ui/\\evil",
            "/other",
            "javascript:alert(1)",
        ] {
            assert!(!is_dashboard_path(bad), "{bad}");
        }
    }

    #[test]
    fn origin_must_name_this_host() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8642"));
        assert!(same_origin(&headers));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8642"),
        );
        assert!(same_origin(&headers));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&headers));
        headers.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&headers));
    }

    #[test]
    fn cookies_are_found_by_name() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; talaria_session=abc ; b=2"),
        );
        assert_eq!(cookie(&headers, COOKIE), Some("abc"));
        assert_eq!(cookie(&headers, "c"), None);
        let set = set_cookie(COOKIE, "t", 60, false);
        let set = set.to_str().unwrap();
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict"),
            "{set}"
        );
        assert!(!set.contains("Secure"));
    }
}
