//! A fake of OpenAI's media endpoints, on 127.0.0.1.
//!
//! [`FakeOpenAiMedia`] answers the three endpoints Talaria's speech and
//! image clients call, with the request shapes of OpenAI's API reference:
//!
//! - `POST /v1/audio/transcriptions`: a `multipart/form-data` body, parsed
//!   for real (axum's `Multipart`), with the fields `file` (the audio,
//!   with a file name and a content type), `model`, and the optional
//!   `response_format` (`json`, the default, answers `{"text": …}`; `text`
//!   answers the bare text), `language`, `prompt`, `temperature`. A
//!   request without `file` or `model` gets 400 with an
//!   `invalid_request_error`, as OpenAI answers it.
//! - `POST /v1/audio/speech`: JSON `{model, input, voice,
//!   response_format?, speed?, instructions?}`; `model`, `input` and
//!   `voice` are required. The answer is the audio bytes.
//! - `POST /v1/images/generations`: JSON `{prompt, model?, n?, size?,
//!   response_format?, quality?}`; `prompt` is required. The answer is
//!   `{"created": <unix seconds>, "data": [{"b64_json": …}]}` or, for an
//!   image scripted as a URL, `{"data": [{"url": …}]}` with a URL on this
//!   server (`GET /files/<n>`).
//!
//! What each request gets comes from a FIFO script of [`MediaReply`]
//! values (an empty script answers 500, so a test says what it expects);
//! errors are OpenAI's `{"error": {"message", "type", "param", "code"}}`
//! with the status given. Every request is logged ([`MediaRequest`]): path,
//! headers, the JSON body or the form's text fields, and for an uploaded
//! file its name, type, length and sha256.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Multipart, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use base64::Engine;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::{json_response, lock, serve_on_own_thread};

/// The largest request body accepted: uploads of a few tens of MB, as
/// OpenAI's 25 MB audio limit.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// A file uploaded in a multipart form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadedFile {
    /// The part's file name, as sent.
    pub name: String,
    /// The part's content type, as sent (empty when none).
    pub content_type: String,
    /// Its length in bytes.
    pub len: usize,
    /// The sha256 of its bytes, lowercase hex.
    pub sha256: String,
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct MediaRequest {
    /// The request path, e.g. `/v1/audio/speech`.
    pub path: String,
    /// Header names lowercased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The JSON body; `Value::Null` for a form or a body that is not JSON.
    pub json: Value,
    /// A multipart form's text fields, in order.
    pub fields: Vec<(String, String)>,
    /// A multipart form's `file` part.
    pub file: Option<UploadedFile>,
}

impl MediaRequest {
    /// The first value of a header (name matched case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The first text field of a form with this name.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone)]
enum What {
    Transcript(String),
    Speech {
        bytes: Vec<u8>,
        content_type: String,
    },
    ImageB64(Vec<u8>),
    ImageUrl {
        bytes: Vec<u8>,
        content_type: String,
    },
    Error {
        status: u16,
        message: String,
        kind: String,
    },
}

/// A scripted answer to one request.
#[derive(Debug, Clone)]
pub struct MediaReply {
    what: What,
    delay: Option<Duration>,
}

impl MediaReply {
    fn of(what: What) -> MediaReply {
        MediaReply { what, delay: None }
    }

    /// For a transcription: this text.
    pub fn transcript(text: impl Into<String>) -> MediaReply {
        MediaReply::of(What::Transcript(text.into()))
    }

    /// For a speech request: these bytes with this content type.
    pub fn speech(bytes: impl Into<Vec<u8>>, content_type: impl Into<String>) -> MediaReply {
        MediaReply::of(What::Speech {
            bytes: bytes.into(),
            content_type: content_type.into(),
        })
    }

    /// For an image generation: these bytes, base64 in `b64_json`.
    pub fn image_b64(bytes: impl Into<Vec<u8>>) -> MediaReply {
        MediaReply::of(What::ImageB64(bytes.into()))
    }

    /// For an image generation: a `url` on this server that serves these
    /// bytes with this content type.
    pub fn image_url(bytes: impl Into<Vec<u8>>, content_type: impl Into<String>) -> MediaReply {
        MediaReply::of(What::ImageUrl {
            bytes: bytes.into(),
            content_type: content_type.into(),
        })
    }

    /// For any endpoint: an OpenAI error, `{"error": {"message", "type"}}`,
    /// with this status.
    pub fn error(status: u16, message: impl Into<String>, kind: impl Into<String>) -> MediaReply {
        MediaReply::of(What::Error {
            status,
            message: message.into(),
            kind: kind.into(),
        })
    }

    /// Waits this long before answering.
    pub fn with_delay(mut self, delay: Duration) -> MediaReply {
        self.delay = Some(delay);
        self
    }
}

struct Shared {
    addr: SocketAddr,
    script: Mutex<VecDeque<MediaReply>>,
    log: Mutex<Vec<MediaRequest>>,
    /// Images served at `/files/<n>`.
    files: Mutex<Vec<(Vec<u8>, String)>>,
}

/// A fake OpenAI media server (see the module docs). Stops when dropped.
pub struct FakeOpenAiMedia {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
}

impl FakeOpenAiMedia {
    /// Starts the fake on 127.0.0.1 with an ephemeral port.
    ///
    /// # Panics
    /// When no local port can be bound (a broken test environment).
    pub async fn start() -> FakeOpenAiMedia {
        crate::fake::started("the fake OpenAI media server", FakeOpenAiMedia::try_start())
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start() -> std::io::Result<FakeOpenAiMedia> {
        let (listener, addr) = crate::fake::bind()?;
        let shared = Arc::new(Shared {
            addr,
            script: Mutex::new(VecDeque::new()),
            log: Mutex::new(Vec::new()),
            files: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/v1/audio/transcriptions", post(transcriptions))
            .route("/v1/audio/speech", post(speech))
            .route("/v1/images/generations", post(generations))
            .route("/files/{n}", get(file))
            .fallback(not_found)
            .layer(DefaultBodyLimit::max(MAX_BODY))
            .with_state(shared.clone());
        let (stop, stopped) = watch::channel(false);
        serve_on_own_thread("fake-openai-media", listener, app, stopped)?;
        Ok(FakeOpenAiMedia { shared, stop })
    }

    /// `http://127.0.0.1:PORT/v1`, the base URL an OpenAI client expects.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.shared.addr)
    }

    /// The bound socket address.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// Appends a reply to the script.
    pub fn push(&self, reply: MediaReply) {
        lock(&self.shared.script).push_back(reply);
    }

    /// Scripted replies not yet used.
    pub fn pending(&self) -> usize {
        lock(&self.shared.script).len()
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<MediaRequest> {
        lock(&self.shared.log).clone()
    }
}

impl Drop for FakeOpenAiMedia {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

fn headers_of(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// OpenAI's error body.
fn error(status: u16, message: &str, kind: &str, param: Option<&str>) -> Response {
    json_response(
        status,
        &json!({"error": {"message": message, "type": kind, "param": param, "code": null}}),
    )
}

fn invalid(message: &str, param: &str) -> Response {
    error(400, message, "invalid_request_error", Some(param))
}

/// The next scripted reply, after its delay.
async fn next(shared: &Shared) -> Option<MediaReply> {
    let reply = lock(&shared.script).pop_front()?;
    if let Some(d) = reply.delay {
        tokio::time::sleep(d).await;
    }
    Some(reply)
}

/// What to answer when the script has no reply of the kind asked for.
fn unscripted(endpoint: &str, reply: Option<&MediaReply>) -> Response {
    let message = match reply {
        None => format!("fake: the script is empty ({endpoint})"),
        Some(r) => format!(
            "fake: the next reply ({:?}) is not for {endpoint}",
            kind_name(&r.what)
        ),
    };
    error(500, &message, "server_error", None)
}

fn kind_name(what: &What) -> &'static str {
    match what {
        What::Transcript(_) => "transcript",
        What::Speech { .. } => "speech",
        What::ImageB64(_) | What::ImageUrl { .. } => "image",
        What::Error { .. } => "error",
    }
}

async fn transcriptions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    mut form: Multipart,
) -> Response {
    let mut request = MediaRequest {
        path: "/v1/audio/transcriptions".to_owned(),
        headers: headers_of(&headers),
        json: Value::Null,
        fields: Vec::new(),
        file: None,
    };
    let mut broken = None;
    loop {
        match form.next_field().await {
            Ok(Some(field)) => {
                let name = field.name().unwrap_or("").to_owned();
                if name == "file" {
                    let file_name = field.file_name().unwrap_or("").to_owned();
                    let content_type = field.content_type().unwrap_or("").to_owned();
                    match field.bytes().await {
                        Ok(bytes) => {
                            request.file = Some(UploadedFile {
                                name: file_name,
                                content_type,
                                len: bytes.len(),
                                sha256: format!("{:x}", Sha256::digest(&bytes)),
                            });
                        }
                        Err(e) => {
                            broken = Some(e.body_text());
                            break;
                        }
                    }
                } else {
                    match field.text().await {
                        Ok(text) => request.fields.push((name, text)),
                        Err(e) => {
                            broken = Some(e.body_text());
                            break;
                        }
                    }
                }
            }
            Ok(None) => break,
            Err(e) => {
                broken = Some(e.body_text());
                break;
            }
        }
    }
    let response_format = request
        .field("response_format")
        .unwrap_or("json")
        .to_owned();
    let has_model = request.field("model").is_some_and(|m| !m.is_empty());
    let has_file = request.file.is_some();
    lock(&shared.log).push(request);
    if let Some(why) = broken {
        return invalid(&format!("Could not parse multipart form: {why}"), "file");
    }
    if !has_file {
        return invalid("you must provide a file", "file");
    }
    if !has_model {
        return invalid("you must provide a model parameter", "model");
    }
    let reply = next(&shared).await;
    match reply.as_ref().map(|r| &r.what) {
        Some(What::Transcript(text)) if response_format == "text" => {
            let mut r = Response::new(Body::from(text.clone()));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            r
        }
        Some(What::Transcript(text)) => json_response(200, &json!({"text": text})),
        Some(What::Error {
            status,
            message,
            kind,
        }) => error(*status, message, kind, None),
        _ => unscripted("transcriptions", reply.as_ref()),
    }
}

/// A refusal as OpenAI words it: the message and the parameter at fault.
type Refusal = (String, &'static str);

/// Logs a JSON request; the body parsed, or why it is refused.
fn log_json(
    shared: &Shared,
    path: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Value, Refusal> {
    let json: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    lock(&shared.log).push(MediaRequest {
        path: path.to_owned(),
        headers: headers_of(headers),
        json: json.clone(),
        fields: Vec::new(),
        file: None,
    });
    if !json.is_object() {
        return Err((
            "We could not parse the JSON body of your request.".to_owned(),
            "body",
        ));
    }
    Ok(json)
}

fn require(json: &Value, fields: &[&'static str]) -> Result<(), Refusal> {
    for f in fields {
        if json
            .get(*f)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err((format!("Missing required parameter: '{f}'."), f));
        }
    }
    Ok(())
}

async fn speech(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err((message, param)) = log_json(&shared, "/v1/audio/speech", &headers, &body)
        .and_then(|j| require(&j, &["model", "input", "voice"]))
    {
        return invalid(&message, param);
    }
    let reply = next(&shared).await;
    match reply.as_ref().map(|r| &r.what) {
        Some(What::Speech {
            bytes,
            content_type,
        }) => bytes_response(bytes.clone(), content_type),
        Some(What::Error {
            status,
            message,
            kind,
        }) => error(*status, message, kind, None),
        _ => unscripted("speech", reply.as_ref()),
    }
}

async fn generations(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err((message, param)) = log_json(&shared, "/v1/images/generations", &headers, &body)
        .and_then(|j| require(&j, &["prompt"]))
    {
        return invalid(&message, param);
    }
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let reply = next(&shared).await;
    match reply.as_ref().map(|r| &r.what) {
        Some(What::ImageB64(bytes)) => {
            let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
            json_response(
                200,
                &json!({"created": created, "data": [{"b64_json": b64}]}),
            )
        }
        Some(What::ImageUrl {
            bytes,
            content_type,
        }) => {
            let n = {
                let mut files = lock(&shared.files);
                files.push((bytes.clone(), content_type.clone()));
                files.len() - 1
            };
            let url = format!("http://{}/files/{n}", shared.addr);
            json_response(200, &json!({"created": created, "data": [{"url": url}]}))
        }
        Some(What::Error {
            status,
            message,
            kind,
        }) => error(*status, message, kind, None),
        _ => unscripted("images/generations", reply.as_ref()),
    }
}

async fn file(
    State(shared): State<Arc<Shared>>,
    Path(n): Path<usize>,
    headers: HeaderMap,
) -> Response {
    lock(&shared.log).push(MediaRequest {
        path: format!("/files/{n}"),
        headers: headers_of(&headers),
        json: Value::Null,
        fields: Vec::new(),
        file: None,
    });
    let found = lock(&shared.files).get(n).cloned();
    match found {
        Some((bytes, content_type)) => bytes_response(bytes, &content_type),
        None => error(404, "no such file", "not_found", None),
    }
}

async fn not_found(headers: HeaderMap, uri: axum::http::Uri) -> Response {
    let _ = headers;
    error(
        404,
        &format!("fake: no route for {}", uri.path()),
        "invalid_request_error",
        None,
    )
}

fn bytes_response(bytes: Vec<u8>, content_type: &str) -> Response {
    let mut r = Response::new(Body::from(bytes));
    *r.status_mut() = StatusCode::OK;
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_transcription_without_a_file_or_model_is_refused_as_openai_does() {
        let fake = FakeOpenAiMedia::start().await;
        let client = reqwest::Client::new();
        let url = format!("{}/audio/transcriptions", fake.base_url());
        let form = reqwest::multipart::Form::new().text("model", "whisper-1");
        let r = client.post(&url).multipart(form).send().await.unwrap();
        assert_eq!(r.status(), 400);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "file");

        let part = reqwest::multipart::Part::bytes(b"RIFF....WAVE".to_vec())
            .file_name("a.wav")
            .mime_str("audio/wav")
            .unwrap();
        let form = reqwest::multipart::Form::new()
            .part("file", part)
            .text("language", "fr");
        let r = client.post(&url).multipart(form).send().await.unwrap();
        assert_eq!(r.status(), 400);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["param"], "model");
        let log = fake.requests();
        assert_eq!(log[1].field("language"), Some("fr"));
        let file = log[1].file.as_ref().unwrap();
        assert_eq!(
            (file.name.as_str(), file.content_type.as_str(), file.len),
            ("a.wav", "audio/wav", 12)
        );
    }

    #[tokio::test]
    async fn text_format_and_scripted_errors() {
        let fake = FakeOpenAiMedia::start().await;
        fake.push(MediaReply::transcript("bonjour"));
        fake.push(MediaReply::error(
            429,
            "Rate limit reached",
            "rate_limit_error",
        ));
        let client = reqwest::Client::new();
        let url = format!("{}/audio/transcriptions", fake.base_url());
        let form = || {
            let part = reqwest::multipart::Part::bytes(vec![1, 2, 3]).file_name("x.ogg");
            reqwest::multipart::Form::new()
                .part("file", part)
                .text("model", "whisper-1")
                .text("response_format", "text")
        };
        let r = client.post(&url).multipart(form()).send().await.unwrap();
        assert_eq!(r.text().await.unwrap(), "bonjour");
        let r = client.post(&url).multipart(form()).send().await.unwrap();
        assert_eq!(r.status(), 429);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["message"], "Rate limit reached");
        // Empty script: a 500 that says so.
        let r = client.post(&url).multipart(form()).send().await.unwrap();
        assert_eq!(r.status(), 500);
    }

    #[tokio::test]
    async fn speech_and_images_check_their_required_fields() {
        let fake = FakeOpenAiMedia::start().await;
        let client = reqwest::Client::new();
        let r = client
            .post(format!("{}/audio/speech", fake.base_url()))
            .json(&json!({"model": "tts-1", "input": "hi"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        fake.push(MediaReply::image_url(
            b"\x89PNG\r\n\x1a\n".to_vec(),
            "image/png",
        ));
        let r: Value = client
            .post(format!("{}/images/generations", fake.base_url()))
            .json(&json!({"prompt": "a cat", "n": 1}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let url = r["data"][0]["url"].as_str().unwrap();
        let got = client.get(url).send().await.unwrap();
        assert_eq!(got.headers()["content-type"], "image/png");
        assert_eq!(got.bytes().await.unwrap().as_ref(), b"\x89PNG\r\n\x1a\n");
    }
}
