//! Google's side of a Google Chat app, for adapter and end-to-end tests,
//! written from Google's documentation (Chat API reference
//! `spaces.messages.create`, "Verify requests from Google Chat", and
//! OAuth 2.0 for service accounts).
//!
//! [`FakeGoogle`] serves on 127.0.0.1:
//!
//! - `GET /jwks`: the JWK set Google signs Chat's event tokens with (one
//!   RSA key, `kid` set);
//! - `POST /token`: the JWT bearer grant. The assertion must be RS256,
//!   signed with the service account's key, `iss` its e-mail, `aud` this
//!   URL, the `chat.bot` scope, and unexpired; answered `{access_token,
//!   expires_in, token_type}`, else 400 `{error: "invalid_grant"}`;
//! - `POST /v1/spaces/{space}/messages?messageReplyOption=…&messageId=…`:
//!   a bearer token it issued (else 401 `UNAUTHENTICATED`); `text` of at
//!   most 4,096 characters; `thread.name` in that space; a `messageId`
//!   (`client-` and at most 56 lowercase letters, digits and hyphens)
//!   used before gets 409 `ALREADY_EXISTS` and creates nothing.
//!
//! Keys are made by the `openssl` command line at start. Tests queue
//! failures and hang creates; [`FakeGoogle::event_token`] signs an
//! event's bearer token as Chat does for a project-number audience.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::signature::{self, RsaKeyPair, RsaPublicKeyComponents};
use serde_json::{Value, json};

use crate::fake::{Core, Faults, bind};
use crate::json_response;

/// Who signs Chat's event tokens for a project-number audience.
pub const CHAT_ISSUER: &str = "chat@system.gserviceaccount.com";
/// The service account the app posts as.
pub const APP_EMAIL: &str = "talaria-bot@talaria-test.iam.gserviceaccount.com";
/// Chat's longest text.
pub const MAX_TEXT_CHARS: usize = 4096;

/// A failure the next create gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// An error in Google's shape.
    Status {
        /// The HTTP status.
        status: u16,
        /// Google's `error.status` (`PERMISSION_DENIED`, ...).
        code: String,
        /// `Retry-After`, in seconds.
        retry_after: Option<u64>,
    },
    /// The message is created, then the answer is lost: a 503 comes
    /// back, as from a proxy that lost Google's answer.
    LostAnswer,
}

/// One message the fake created.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// Its resource name.
    pub name: String,
    /// The space.
    pub space: String,
    /// The thread it went to, when the request named one.
    pub thread: Option<String>,
    /// The text.
    pub text: String,
    /// The client-assigned id.
    pub message_id: String,
    /// When it was created.
    pub at: Instant,
}

/// Any request, recorded as it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path.
    pub path: String,
}

#[derive(Default)]
struct Book {
    next: u64,
    tokens: HashSet<String>,
    ids: HashMap<String, String>,
    sent: Vec<Sent>,
    failures: Faults<Failure>,
    send_attempts: Vec<Instant>,
}

struct Shared {
    base: String,
    google: RsaKeyPair,
    account: RsaKeyPair,
    core: Core<Book, Request>,
}

/// Google's side (see the module docs).
pub struct FakeGoogle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    account_pem: String,
}

const KID: &str = "fake-google-key-1";

/// A 2048-bit RSA key in PKCS#8 PEM, from the openssl command line.
///
/// # Panics
/// When openssl is missing (scripts/test installs it) or fails.
pub fn new_rsa_key_pem() -> String {
    let out = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .expect("openssl is installed (scripts/test installs it)");
    assert!(out.status.success(), "openssl genpkey: {out:?}");
    String::from_utf8(out.stdout).expect("PEM is ASCII")
}

fn key_from_pem(pem: &str) -> RsaKeyPair {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = STANDARD.decode(body.trim()).expect("PEM body");
    RsaKeyPair::from_pkcs8(&der).expect("an RSA PKCS#8 key")
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn sign_jwt(key: &RsaKeyPair, header: &Value, claims: &Value) -> String {
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let mut sig = vec![0u8; key.public().modulus_len()];
    key.sign(
        &signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        input.as_bytes(),
        &mut sig,
    )
    .expect("RSA signing");
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
}

/// The claims of `token` when `key` signed it.
fn verified_claims(key: &RsaKeyPair, token: &str) -> Option<Value> {
    let (input, sig) = token.rsplit_once('.')?;
    let sig = URL_SAFE_NO_PAD.decode(sig).ok()?;
    let public: RsaPublicKeyComponents<Vec<u8>> = key.public().into();
    public
        .verify(
            &signature::RSA_PKCS1_2048_8192_SHA256,
            input.as_bytes(),
            &sig,
        )
        .ok()?;
    let (header, claims) = input.split_once('.')?;
    let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).ok()?).ok()?;
    if header["alg"] != "RS256" {
        return None;
    }
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).ok()?).ok()
}

impl FakeGoogle {
    /// Starts the server on 127.0.0.1 with fresh keys.
    ///
    /// # Panics
    /// When no port can be bound or openssl is missing.
    pub fn start() -> FakeGoogle {
        let account_pem = new_rsa_key_pem();
        let google = key_from_pem(&new_rsa_key_pem());
        let account = key_from_pem(&account_pem);
        let (listener, addr) = bind().expect("a port on 127.0.0.1");
        let shared = Arc::new(Shared {
            base: format!("http://{addr}"),
            google,
            account,
            core: Core::new(Book::default()),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        shared
            .core
            .serve("fake-google", listener, app)
            .expect("the fake Google serves");
        FakeGoogle {
            addr,
            shared,
            account_pem,
        }
    }

    /// `http://127.0.0.1:PORT`: the `api_base`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A line of the service account's private key, which no log may
    /// show.
    pub fn private_key_line(&self) -> &str {
        self.account_pem.lines().nth(1).unwrap_or("PRIVATE KEY")
    }

    /// The JWK set's URL.
    pub fn jwks_url(&self) -> String {
        format!("{}/jwks", self.base_url())
    }

    /// The service account's key file, as Google's console downloads it.
    pub fn service_account_json(&self) -> String {
        json!({
            "type": "service_account", "project_id": "talaria-test",
            "private_key_id": "0123456789abcdef", "private_key": self.account_pem,
            "client_email": APP_EMAIL, "client_id": "1000000000000000000001",
            "token_uri": format!("{}/token", self.base_url()),
        })
        .to_string()
    }

    /// An event's bearer token for `audience`, as Chat signs it.
    pub fn event_token(&self, audience: &str) -> String {
        let t = now();
        sign_jwt(
            &self.shared.google,
            &json!({"alg": "RS256", "kid": KID, "typ": "JWT"}),
            &json!({"iss": CHAT_ISSUER, "aud": audience, "iat": t, "exp": t + 3600}),
        )
    }

    /// A token signed with another key, claiming to be Chat's.
    pub fn forged_token(&self, audience: &str) -> String {
        let t = now();
        sign_jwt(
            &self.shared.account,
            &json!({"alg": "RS256", "kid": KID, "typ": "JWT"}),
            &json!({"iss": CHAT_ISSUER, "aud": audience, "iat": t, "exp": t + 3600}),
        )
    }

    /// Every message created, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.core.read().sent.clone()
    }

    /// When each create arrived.
    pub fn send_attempts(&self) -> Vec<Instant> {
        self.shared.core.read().send_attempts.clone()
    }

    /// Every request.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// The next create gets `failure`.
    pub fn fail_next_send(&self, failure: Failure) {
        self.shared.core.change().failures.push(failure);
    }

    /// While on, creates hang and create nothing; off, the held ones get
    /// 502.
    pub fn hang_sends(&self, on: bool) {
        self.shared.core.set_hang(on);
    }

    /// Waits until `n` messages were created.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        self.shared
            .core
            .wait_len("Chat messages", n, timeout, |b| &b.sent)
            .await
    }

    /// Waits until `n` creates arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) {
        self.shared
            .core
            .wait_len("Chat creates", n, timeout, |b| &b.send_attempts)
            .await;
    }
}

impl Drop for FakeGoogle {
    fn drop(&mut self) {
        self.shared.core.stop();
    }
}

fn google_error(status: u16, code: &str, message: &str) -> Response {
    json_response(
        status,
        &json!({"error": {"code": status, "message": message, "status": code}}),
    )
}

fn is_client_id(id: &str) -> bool {
    id.strip_prefix("client-").is_some_and(|rest| {
        !rest.is_empty()
            && id.len() <= 63
            && rest
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    })
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let creating =
        method == Method::POST && path.starts_with("/v1/") && path.ends_with("/messages");
    let hung = creating && shared.core.hanging();
    shared.core.record(Request {
        method: method.to_string(),
        path: path.clone(),
    });
    if creating {
        shared.core.change().send_attempts.push(Instant::now());
        if hung {
            shared.core.held().await;
            return google_error(502, "UNAVAILABLE", "Bad Gateway");
        }
    }
    match (method.as_str(), path.as_str()) {
        ("GET", "/jwks") => {
            let public: RsaPublicKeyComponents<Vec<u8>> = shared.google.public().into();
            json_response(
                200,
                &json!({"keys": [{"kty": "RSA", "alg": "RS256", "use": "sig", "kid": KID,
                                  "n": URL_SAFE_NO_PAD.encode(&public.n),
                                  "e": URL_SAFE_NO_PAD.encode(&public.e)}]}),
            )
        }
        ("POST", "/token") => token(&shared, &body),
        _ if creating => create(&shared, &path, &query, &headers, &body),
        _ => google_error(404, "NOT_FOUND", "Requested entity was not found."),
    }
}

fn token(shared: &Shared, body: &[u8]) -> Response {
    let form: HashMap<String, String> = form_urlencoded::parse(body).into_owned().collect();
    let invalid = |why: &str| {
        json_response(
            400,
            &json!({"error": "invalid_grant", "error_description": why}),
        )
    };
    if form.get("grant_type").map(String::as_str)
        != Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
    {
        return json_response(400, &json!({"error": "unsupported_grant_type"}));
    }
    let Some(claims) = form
        .get("assertion")
        .and_then(|a| verified_claims(&shared.account, a))
    else {
        return invalid("Invalid JWT Signature.");
    };
    let t = now();
    if claims["iss"] != APP_EMAIL
        || claims["aud"] != format!("{}/token", shared.base)
        || !claims["scope"].as_str().is_some_and(|s| {
            s.split(' ')
                .any(|s| s == "https://www.googleapis.com/auth/chat.bot")
        })
        || claims["exp"].as_i64().is_none_or(|e| e < t)
        || claims["iat"].as_i64().is_none_or(|i| i > t + 60)
    {
        return invalid("Invalid JWT: claims");
    }
    let mut book = shared.core.change();
    let n = book.next;
    book.next += 1;
    let token = format!("ya29.fake-{n}");
    book.tokens.insert(token.clone());
    json_response(
        200,
        &json!({"access_token": token, "expires_in": 3599, "token_type": "Bearer"}),
    )
}

fn create(
    shared: &Shared,
    path: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let mut book = shared.core.change();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if !bearer.is_some_and(|t| book.tokens.contains(t)) {
        return google_error(
            401,
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials.",
        );
    }
    let failure = book.failures.take();
    let lost = failure == Some(Failure::LostAnswer);
    if let Some(Failure::Status {
        status,
        code,
        retry_after,
    }) = failure
    {
        let mut r = google_error(status, &code, "injected");
        if let Some(secs) = retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return r;
    }
    let space = path
        .trim_start_matches("/v1/")
        .trim_end_matches("/messages")
        .to_owned();
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let text = body["text"].as_str().unwrap_or_default();
    if text.is_empty() || text.chars().count() > MAX_TEXT_CHARS {
        return google_error(400, "INVALID_ARGUMENT", "Invalid text length.");
    }
    let thread = body["thread"]["name"].as_str().map(str::to_owned);
    if thread
        .as_deref()
        .is_some_and(|t| !t.starts_with(&format!("{space}/threads/")))
    {
        return google_error(400, "INVALID_ARGUMENT", "Thread is not in the space.");
    }
    let Some(id) = query.get("messageId").filter(|id| is_client_id(id)) else {
        return google_error(400, "INVALID_ARGUMENT", "Invalid messageId.");
    };
    if book.ids.contains_key(id) {
        return google_error(409, "ALREADY_EXISTS", "Message already exists.");
    }
    let n = book.next;
    book.next += 1;
    let name = format!("{space}/messages/bot-{n}");
    book.ids.insert(id.clone(), name.clone());
    book.sent.push(Sent {
        name: name.clone(),
        space: space.clone(),
        thread: thread.clone(),
        text: text.to_owned(),
        message_id: id.clone(),
        at: Instant::now(),
    });
    if lost {
        return google_error(503, "UNAVAILABLE", "The service is currently unavailable.");
    }
    json_response(
        200,
        &json!({"name": name, "text": text, "thread": {"name": thread.unwrap_or_else(|| format!("{space}/threads/new-{n}"))},
                "sender": {"name": "users/app", "type": "BOT"}}),
    )
}
