//! What every page's template shares: the frame around it (navigation,
//! the CSRF token, the message left by the last change), rendering, and
//! values in words.

use askama::Template;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde_json::Value;

use crate::auth::{self, Login};

/// The cookie that carries the outcome of a change to the page shown
/// after it.
const FLASH: &str = "talaria_flash";

/// The pages in the navigation: id, path, label.
const NAV: &[(&str, &str, &str)] = &[
    ("overview", "/ui/", "Overview"),
    ("sessions", "/ui/sessions", "Sessions"),
    ("chat", "/ui/chat", "Chat"),
    ("pairing", "/ui/pairing", "Pairing"),
    ("cron", "/ui/cron", "Cron"),
    ("memory", "/ui/memory", "Memory"),
    ("skills", "/ui/skills", "Skills"),
    ("learning", "/ui/learning", "Learning"),
    ("graph", "/ui/graph", "Graph"),
    ("config", "/ui/config", "Config"),
    ("logs", "/ui/logs", "Logs"),
];

/// One link of the navigation.
pub(crate) struct NavItem {
    pub(crate) href: &'static str,
    pub(crate) label: &'static str,
    pub(crate) active: bool,
}

/// The outcome of the last change, shown once.
pub(crate) struct Flash {
    pub(crate) ok: bool,
    pub(crate) text: String,
}

impl Flash {
    /// The flash the request's cookie carries.
    fn from_headers(headers: &HeaderMap) -> Option<Flash> {
        let raw = auth::cookie(headers, FLASH)?;
        let decoded: String = form_urlencoded::parse(format!("f={raw}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())?;
        let (kind, text) = decoded.split_once(':')?;
        let text: String = text.chars().take(500).collect();
        (!text.is_empty()).then(|| Flash {
            ok: kind == "ok",
            text,
        })
    }
}

/// The frame around a page.
pub(crate) struct Frame {
    pub(crate) title: String,
    pub(crate) csrf: String,
    pub(crate) nav: Vec<NavItem>,
    pub(crate) flash: Option<Flash>,
}

impl Frame {
    /// The frame of page `id` titled `title`, for the request with
    /// `headers` made with `login`.
    pub(crate) fn new(
        id: &str,
        title: impl Into<String>,
        login: &Login,
        headers: &HeaderMap,
    ) -> Frame {
        Frame {
            title: title.into(),
            csrf: login.csrf.clone(),
            nav: NAV
                .iter()
                .map(|(page, href, label)| NavItem {
                    href,
                    label,
                    active: *page == id,
                })
                .collect(),
            flash: Flash::from_headers(headers),
        }
    }
}

/// Something that renders as a page within a [`Frame`].
pub(crate) trait Page: Template {
    fn frame(&self) -> &Frame;
}

/// Makes a template struct with a `frame` field a [`Page`].
macro_rules! framed {
    ($($page:ty),+ $(,)?) => {
        $(impl $crate::view::Page for $page {
            fn frame(&self) -> &$crate::view::Frame {
                &self.frame
            }
        })+
    };
}
pub(crate) use framed;

/// The rendered page (and the flash cleared, once shown).
pub(crate) fn render<P: Page>(page: &P) -> Response {
    let shown_flash = page.frame().flash.is_some();
    let mut response = match page.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "a dashboard page failed to render");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("The page failed to render: {e}"),
            )
                .into_response()
        }
    };
    if shown_flash {
        response
            .headers_mut()
            .append(header::SET_COOKIE, auth::set_cookie(FLASH, "", 0, false));
    }
    response
}

/// After a change: back to `to`, with the outcome (the API's answer in
/// words) shown there once.
pub(crate) fn after_change(to: &str, outcome: Result<String, String>) -> Response {
    let (kind, text) = match outcome {
        Ok(text) => ("ok", text),
        Err(text) => ("err", text),
    };
    let text: String = text.chars().take(500).collect();
    let value: String =
        form_urlencoded::byte_serialize(format!("{kind}:{text}").as_bytes()).collect();
    let mut response = Redirect::to(to).into_response();
    response.headers_mut().append(
        header::SET_COOKIE,
        auth::set_cookie(FLASH, &value, 60, false),
    );
    response
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage<'a> {
    error: Option<&'a str>,
    next: Option<&'a str>,
}

/// The login form, with `error` above it.
pub(crate) fn login_page(status: StatusCode, error: Option<&str>, next: Option<&str>) -> Response {
    match (LoginPage { error, next }).render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// A Unix time (seconds) as a UTC date and time.
pub(crate) fn when(seconds: f64) -> String {
    if !seconds.is_finite() || seconds <= 0.0 {
        return String::new();
    }
    chrono::DateTime::from_timestamp(seconds as i64, 0)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default()
}

/// A JSON time (seconds, possibly null) as [`when`] gives it.
pub(crate) fn when_value(value: &Value) -> String {
    value.as_f64().map(when).unwrap_or_default()
}

/// A JSON string field, or "" for anything else.
pub(crate) fn text(value: &Value, key: &str) -> String {
    match value.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => b.to_string(),
        _ => String::new(),
    }
}

/// A JSON whole number field, or 0.
pub(crate) fn count(value: &Value, key: &str) -> u64 {
    value.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// A percent-encoded path segment or query value.
pub(crate) fn encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_flash_survives_its_cookie() {
        let response = after_change("/ui/cron", Ok("Paused \"nightly; run\" <ok>".to_owned()));
        let set = response.headers()[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .to_owned();
        let value = set.split(';').next().unwrap().to_owned();
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_str(&value).unwrap());
        let flash = Flash::from_headers(&headers).unwrap();
        assert!(flash.ok);
        assert_eq!(flash.text, "Paused \"nightly; run\" <ok>");
    }

    #[test]
    fn times_read_as_utc() {
        assert_eq!(when(0.0), "");
        assert_eq!(when(1_700_000_000.0), "2023-11-14 22:13:20 UTC");
    }
}
