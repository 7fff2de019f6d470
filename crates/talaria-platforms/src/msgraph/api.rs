//! The Graph calls the adapter makes, its two kinds of token, and what
//! their errors mean.
//!
//! - The app token: `POST {authority}/{tenant}/oauth2/v2.0/token` with
//!   `grant_type=client_credentials`; kept until two minutes before it
//!   expires, dropped when Graph answers 401 (the call is made once more
//!   with a fresh one). Reads, subscriptions and mail replies use it.
//! - The delegated token, for posting into chats and channels, which
//!   Graph refuses app-only tokens for: from a configured refresh token
//!   (`grant_type=refresh_token`, the rotated refresh token kept in
//!   memory) or a configured access token as is.
//!
//! Graph answers errors as `{"error": {"code", "message"}}`. Reads and
//! subscription calls are retried up to three times on 429 and 5xx,
//! waiting what `Retry-After` says (else 0.5 s doubling, at most 8 s);
//! sends hand 429 to the adapter, which waits it out its own way.

use std::time::{Duration, Instant};

use reqwest::Method;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde::Deserialize;
use serde_json::Value;
use talaria_core::Secret;
use tokio::sync::Mutex;

use crate::http::{Answer, Http, HttpError, Service};

/// How errors name Graph.
pub(crate) const GRAPH: Service = Service {
    name: "Microsoft Graph",
    request: "the Microsoft Graph request",
    code_label: None,
};

/// A token is renewed this long before it expires.
const EARLY: Duration = Duration::from_secs(120);

/// Retries of a read after 429 or 5xx.
const READ_RETRIES: u32 = 3;

/// The longest wait between read retries.
const MAX_READ_WAIT: Duration = Duration::from_secs(8);

/// Which token a call carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum As {
    App,
    User,
}

#[derive(Debug)]
struct Held {
    token: Secret,
    until: Instant,
}

/// The credentials and the Graph root (see the module docs).
#[derive(Debug)]
pub(crate) struct Graph {
    http: Http,
    base: String,
    token_url: String,
    client_id: String,
    client_secret: Secret,
    scope: String,
    delegated_scope: String,
    app: Mutex<Option<Held>>,
    refresh: Mutex<Option<Secret>>,
    user: Mutex<Option<Held>>,
    /// A configured delegated access token, used as is.
    fixed_user: Option<Secret>,
    pub(crate) timeout: Duration,
}

/// What the token endpoint answers.
#[derive(Deserialize)]
struct Issued {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
    #[serde(default)]
    refresh_token: Option<String>,
}

/// The settings [`Graph::new`] takes.
pub(crate) struct Credentials {
    pub base: String,
    pub authority: String,
    pub tenant: String,
    pub client_id: String,
    pub client_secret: Secret,
    pub scope: String,
    pub delegated_scope: String,
    pub refresh_token: Option<Secret>,
    pub access_token: Option<Secret>,
    pub timeout: Duration,
}

impl Graph {
    pub(crate) fn new(c: Credentials) -> Result<Graph, String> {
        Ok(Graph {
            http: Http::new(GRAPH)?.hiding(&c.client_secret, "<client secret>"),
            base: c.base,
            token_url: format!(
                "{}/{}/oauth2/v2.0/token",
                c.authority,
                super::mapping::esc(&c.tenant)
            ),
            client_id: c.client_id,
            client_secret: c.client_secret,
            scope: c.scope,
            delegated_scope: c.delegated_scope,
            app: Mutex::new(None),
            refresh: Mutex::new(c.refresh_token),
            user: Mutex::new(None),
            fixed_user: c.access_token,
            timeout: c.timeout,
        })
    }

    /// Whether chats and channels can be posted to.
    pub(crate) fn can_post_as_user(&self) -> bool {
        self.fixed_user.is_some() || self.refresh_token_set()
    }

    fn refresh_token_set(&self) -> bool {
        self.refresh.try_lock().map_or(true, |r| r.is_some())
    }

    /// Asks the token endpoint with `form`.
    async fn issue(&self, form: &[(&str, &str)]) -> Result<Issued, HttpError> {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let request = self
            .http
            .client()
            .post(&self.token_url)
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body);
        let answer = self.http.send(request, self.timeout).await?;
        if !answer.is_success() {
            let v: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
            let what = v["error_description"]
                .as_str()
                .or(v["error"].as_str())
                .unwrap_or("")
                .lines()
                .next()
                .unwrap_or("")
                .to_owned();
            return Err(self.http.refused(
                answer.status,
                v["error"].as_str().map(str::to_owned),
                &format!("the token endpoint refused: {what}"),
                answer.retry_after(),
            ));
        }
        self.http.decode::<Issued>(&answer)
    }

    /// The app token, fetched when none is held or it is about to expire.
    pub(crate) async fn app_token(&self) -> Result<Secret, HttpError> {
        let mut held = self.app.lock().await;
        if let Some(h) = held.as_ref()
            && Instant::now() + EARLY < h.until
        {
            return Ok(h.token.clone());
        }
        let issued = self
            .issue(&[
                ("grant_type", "client_credentials"),
                ("client_id", &self.client_id),
                ("client_secret", self.client_secret.expose()),
                ("scope", &self.scope),
            ])
            .await?;
        let token = Secret::new(issued.access_token);
        *held = Some(Held {
            token: token.clone(),
            until: Instant::now() + Duration::from_secs(issued.expires_in.unwrap_or(3599)),
        });
        Ok(token)
    }

    /// The delegated token, or `None` when none is configured.
    async fn user_token(&self) -> Result<Option<Secret>, HttpError> {
        if let Some(t) = &self.fixed_user {
            return Ok(Some(t.clone()));
        }
        let mut held = self.user.lock().await;
        if let Some(h) = held.as_ref()
            && Instant::now() + EARLY < h.until
        {
            return Ok(Some(h.token.clone()));
        }
        let mut refresh = self.refresh.lock().await;
        let Some(current) = refresh.clone() else {
            return Ok(None);
        };
        let issued = self
            .issue(&[
                ("grant_type", "refresh_token"),
                ("client_id", &self.client_id),
                ("client_secret", self.client_secret.expose()),
                ("refresh_token", current.expose()),
                ("scope", &self.delegated_scope),
            ])
            .await?;
        if let Some(next) = issued.refresh_token.filter(|t| !t.is_empty()) {
            *refresh = Some(Secret::new(next));
        }
        let token = Secret::new(issued.access_token);
        *held = Some(Held {
            token: token.clone(),
            until: Instant::now() + Duration::from_secs(issued.expires_in.unwrap_or(3599)),
        });
        Ok(Some(token))
    }

    async fn drop_token(&self, who: As) {
        match who {
            As::App => *self.app.lock().await = None,
            As::User => *self.user.lock().await = None,
        }
    }

    /// One call of `method` on `path` (under the root) as `who`, with a
    /// fresh token once after a 401. `Ok(None)` when `who` is the user and
    /// no delegated token is configured.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        who: As,
    ) -> Result<Option<Answer>, HttpError> {
        for attempt in 0..2 {
            let token = match who {
                As::App => self.app_token().await?,
                As::User => match self.user_token().await? {
                    Some(t) => t,
                    None => return Ok(None),
                },
            };
            let url = if path.starts_with("http") {
                path.to_owned()
            } else {
                format!("{}{path}", self.base)
            };
            let mut request = self
                .http
                .client()
                .request(method.clone(), url)
                .header(AUTHORIZATION, format!("Bearer {}", token.expose()));
            if let Some(b) = body {
                request = request.json(b);
            }
            let answer = self.http.send(request, self.timeout).await?;
            if answer.status == 401 && attempt == 0 && self.fixed_user.is_none() {
                self.drop_token(who).await;
                continue;
            }
            return Ok(Some(answer));
        }
        Err(self
            .http
            .refused(401, None, "the token was refused twice", None))
    }

    /// [`Graph::call`] as the app, retried on 429 and 5xx; a refusal as
    /// an error.
    pub(crate) async fn app(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, HttpError> {
        let mut retries = 0;
        loop {
            let answer = self
                .call(method.clone(), path, body, As::App)
                .await?
                .ok_or_else(|| self.http.refused(401, None, "no app token", None))?;
            if answer.is_success() {
                return Ok(answer);
            }
            let again = answer.status == 429 || answer.status >= 500;
            if again && retries < READ_RETRIES {
                let wait = answer.retry_after().unwrap_or(
                    Duration::from_millis(500)
                        .saturating_mul(1 << retries)
                        .min(MAX_READ_WAIT),
                );
                retries += 1;
                tokio::time::sleep(wait.min(MAX_READ_WAIT)).await;
                continue;
            }
            return Err(self.refusal(&answer));
        }
    }

    /// A GET as the app, decoded.
    pub(crate) async fn get(&self, path: &str) -> Result<Value, HttpError> {
        let answer = self.app(Method::GET, path, None).await?;
        self.http.decode(&answer)
    }

    /// The answer as an error, Graph's code and message read from it.
    pub(crate) fn refusal(&self, answer: &Answer) -> HttpError {
        let v: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        let message = v["error"]["message"].as_str().unwrap_or("").to_owned();
        let code = v["error"]["code"].as_str().map(str::to_owned);
        self.http
            .refused(answer.status, code, &message, answer.retry_after())
    }

    /// Decodes a success answer.
    pub(crate) fn decode(&self, answer: &Answer) -> Result<Value, HttpError> {
        self.http.decode(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Failure;

    #[test]
    fn refusals_read_graphs_error_body() {
        let g = Graph::new(Credentials {
            base: "http://127.0.0.1:9".into(),
            authority: "http://127.0.0.1:9".into(),
            tenant: "t".into(),
            client_id: "c".into(),
            client_secret: Secret::new("hush-hush"),
            scope: "s".into(),
            delegated_scope: "d".into(),
            refresh_token: None,
            access_token: None,
            timeout: Duration::from_secs(1),
        })
        .unwrap();
        assert!(!g.can_post_as_user());
        let answer = Answer {
            status: 403,
            headers: Default::default(),
            body: br#"{"error":{"code":"Forbidden","message":"no hush-hush here"}}"#
                .to_vec()
                .into(),
        };
        let e = g.refusal(&answer);
        assert_eq!(e.code(), Some("Forbidden"));
        assert!(
            matches!(&e.failure, Failure::Status { message, .. } if message == "no <client secret> here")
        );
    }
}
