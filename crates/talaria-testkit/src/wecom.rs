//! A fake WeCom on 127.0.0.1 for the self-built app (`wecom_callback`):
//! the server API the app sends through, and the sending side of the
//! app's encrypted callback.
//!
//! [`FakeWecom`] speaks the parts of `qyapi.weixin.qq.com` the adapter
//! uses, over real HTTP with JSON, answering HTTP 200 with an `errcode` as
//! WeCom does:
//!
//! - `GET /cgi-bin/gettoken?corpid=&corpsecret=`: a new access token each
//!   call (`expires_in` 7200); a wrong corp id → 40013, a wrong secret →
//!   40001.
//! - `POST /cgi-bin/message/send?access_token=` with `touser`, `msgtype`
//!   (`text` or `markdown`), `agentid` and the content: `msgid`. No token
//!   → 41001; a token never issued → 40014; a token [`FakeWecom::expire_tokens`]
//!   expired → 42001; another agent → 40056; a content over 2048 UTF-8
//!   bytes → 45002; an empty one → 44004. `image`, `voice`, `video` and
//!   `file` messages name a `media_id` this fake issued for that type
//!   (else 40007). Tests script errcodes for the next sends
//!   ([`FakeWecom::fail_next_send`]: 45009 rate limit, 60020 untrusted IP,
//!   …) or hang them.
//! - `POST /cgi-bin/media/upload?access_token=&type=` with one
//!   `multipart/form-data` part `media` (a file name required), within the
//!   documented limits: over 5 bytes; image JPG/PNG ≤ 10 MB, voice AMR
//!   ≤ 2 MB, video MP4 ≤ 10 MB, file ≤ 20 MB (40004 bad type, 40005 bad
//!   format, 40006 bad size) → `{type, media_id, created_at}`.
//! - `GET /cgi-bin/media/get?access_token=&media_id=`: the bytes of media
//!   a test added ([`FakeWecom::add_media`]) or the app uploaded, with
//!   their `Content-Type`; an unknown id answers the JSON errcode 40007
//!   instead, a bad token 40014 / 42001 as for sends.
//!
//! [`Callback`] builds what WeCom posts to the app, computed without the
//! adapter's code: the message XML, its AES-256-CBC ciphertext by the
//! `openssl` command line (key = the EncodingAESKey decoded, IV = its
//! first 16 bytes, the plaintext padded here to a 32-byte block), and the
//! SHA-1 `msg_signature` over the sorted token, timestamp, nonce and
//! ciphertext.

use std::collections::HashSet;
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::multipart::MultipartRejection;
use axum::extract::{Multipart, State};
use axum::http::{HeaderValue, Method, Uri, header};
use axum::response::Response;
use axum::routing::post;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use sha1::{Digest, Sha1};

use crate::fake::{Core, Faults, bind, started};
use crate::json_response;

/// The most a text or markdown message may carry, in UTF-8 bytes.
pub const MAX_CONTENT_BYTES: usize = 2048;

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET` or `POST`.
    pub method: String,
    /// The path.
    pub path: String,
    /// The query's pairs.
    pub query: Vec<(String, String)>,
    /// The JSON body, when there was one.
    pub body: Option<Value>,
    /// When it arrived.
    pub at: Instant,
}

/// One message the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct SentWecom {
    /// `touser`.
    pub touser: String,
    /// `text` or `markdown`.
    pub msgtype: String,
    /// The content.
    pub content: String,
    /// The id the fake gave it.
    pub msgid: String,
    /// When it was accepted.
    pub at: Instant,
}

/// A file the app uploaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadedMedia {
    /// The upload's `type`.
    pub kind: String,
    /// The `media` part's file name.
    pub file_name: String,
    /// The bytes.
    pub bytes: Vec<u8>,
    /// The media id issued.
    pub media_id: String,
}

/// Media the fake holds: a test's (for `media/get`) or the app's upload.
#[derive(Debug, Clone)]
struct Media {
    kind: String,
    content_type: String,
    bytes: Vec<u8>,
}

/// What the next send gets instead of success.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// This errcode (with WeCom's usual errmsg).
    Code(i64),
    /// No answer until the hang is cleared or the server stops.
    Hang,
}

#[derive(Default)]
struct Book {
    issued: HashSet<String>,
    expired: HashSet<String>,
    tokens: u64,
    sent: Vec<SentWecom>,
    failures: Faults<Failure>,
    media: std::collections::HashMap<String, Media>,
    uploads: Vec<UploadedMedia>,
    next_media: u64,
}

struct Shared {
    corp_id: String,
    secret: String,
    agent_id: i64,
    core: Core<Book, Request>,
}

/// The fake server (see the module docs).
pub struct FakeWecom {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

fn errmsg(code: i64) -> &'static str {
    match code {
        0 => "ok",
        40001 => "invalid credential",
        40004 => "invalid media type",
        40005 => "invalid file type",
        40006 => "invalid file size",
        40007 => "invalid media_id",
        40013 => "invalid corpid",
        40014 => "invalid access_token",
        40056 => "invalid agentid",
        41001 => "access_token missing",
        42001 => "access_token expired",
        44004 => "empty content",
        45002 => "content size out of limit",
        45009 => "api freq out of limit",
        60020 => "not allow to access from your ip",
        _ => "error",
    }
}

fn error(code: i64) -> Response {
    json_response(200, &json!({"errcode": code, "errmsg": errmsg(code)}))
}

impl FakeWecom {
    /// Starts the server for the app `agent_id` of `corp_id` with
    /// `secret`.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub fn start(corp_id: &str, secret: &str, agent_id: i64) -> FakeWecom {
        started(
            "the fake WeCom server",
            Self::try_start(corp_id, secret, agent_id),
        )
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start(corp_id: &str, secret: &str, agent_id: i64) -> std::io::Result<FakeWecom> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            corp_id: corp_id.to_owned(),
            secret: secret.to_owned(),
            agent_id,
            core: Core::new(Book::default()),
        });
        let app = Router::new()
            // Past the documented 20 MB, so the fake (not axum's default
            // 2 MB) decides what is too large.
            .route(
                "/cgi-bin/media/upload",
                post(upload).layer(axum::extract::DefaultBodyLimit::max(24 * 1024 * 1024)),
            )
            .fallback(api)
            .with_state(shared.clone());
        shared.core.serve("fake-wecom", listener, app)?;
        Ok(FakeWecom { addr, shared })
    }

    /// `http://127.0.0.1:PORT`, the API root.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every message accepted so far.
    pub fn sent(&self) -> Vec<SentWecom> {
        self.shared.core.read().sent.clone()
    }

    /// Media a user sent, fetched through `media/get`: its media id.
    pub fn add_media(&self, kind: &str, content_type: &str, bytes: &[u8]) -> String {
        let mut st = self.shared.core.change();
        st.next_media += 1;
        let id = format!(
            "1{}-media-{kind}-{:x}",
            st.next_media,
            st.next_media * 104_729
        );
        st.media.insert(
            id.clone(),
            Media {
                kind: kind.to_owned(),
                content_type: content_type.to_owned(),
                bytes: bytes.to_vec(),
            },
        );
        id
    }

    /// Every file the app uploaded.
    pub fn uploads(&self) -> Vec<UploadedMedia> {
        self.shared.core.read().uploads.clone()
    }

    /// Every `media/get` so far.
    pub fn media_fetches(&self) -> Vec<Request> {
        self.shared
            .core
            .requests_where(|r| r.path == "/cgi-bin/media/get")
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// How many access tokens were issued.
    pub fn tokens_issued(&self) -> usize {
        self.shared
            .core
            .requests_where(|r| r.path == "/cgi-bin/gettoken")
            .len()
    }

    /// Every `message/send`, accepted or not.
    pub fn send_attempts(&self) -> Vec<Request> {
        self.shared.core.requests_where(is_send)
    }

    /// Waits until at least `n` messages were accepted.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<SentWecom> {
        self.shared
            .core
            .wait_len("WeCom messages", n, timeout, |st| &st.sent)
            .await
    }

    /// Waits until at least `n` sends were attempted.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) -> Vec<Request> {
        self.shared
            .core
            .wait_requests("WeCom send attempts", n, timeout, is_send)
            .await
    }

    /// Waits until at least `n` tokens were issued.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_tokens(&self, n: usize, timeout: Duration) {
        self.shared
            .core
            .wait_requests("WeCom tokens", n, timeout, |r| {
                r.path == "/cgi-bin/gettoken"
            })
            .await;
    }

    /// The next send gets `failure`. Calls queue up.
    pub fn fail_next_send(&self, failure: Failure) {
        self.shared.core.change().failures.push(failure);
    }

    /// Every token issued so far expires: sends with one get 42001.
    pub fn expire_tokens(&self) {
        let mut st = self.shared.core.change();
        let issued: Vec<String> = st.issued.drain().collect();
        st.expired.extend(issued);
    }

    /// While set, sends hang unanswered.
    pub fn hang_sends(&self, hang: bool) {
        self.shared.core.set_hang(hang);
    }

    /// Stops the server (also on drop).
    pub fn shutdown(&self) {
        self.shared.core.stop();
    }
}

impl Drop for FakeWecom {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn is_send(r: &Request) -> bool {
    r.method == "POST" && r.path == "/cgi-bin/message/send"
}

async fn api(State(shared): State<Arc<Shared>>, method: Method, uri: Uri, body: Bytes) -> Response {
    let path = uri.path().to_owned();
    let query: Vec<(String, String)> = form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    let field = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let json: Option<Value> = serde_json::from_slice(&body).ok();
    let request = Request {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        body: json.clone(),
        at: Instant::now(),
    };
    let send = is_send(&request);
    // Decided before the attempt is logged, so a test that sees it finds
    // its fate already fixed.
    let hung = send && shared.core.hanging();
    let failure = if send && !hung {
        shared.core.change().failures.take()
    } else {
        None
    };
    shared.core.record(request);
    if hung || failure == Some(Failure::Hang) {
        shared.core.held().await;
        return json_response(502, &json!({"error": "the request was lost"}));
    }
    match (&method, path.as_str()) {
        (&Method::GET, "/cgi-bin/media/get") => {
            if let Err(code) = check_token(&shared, field("access_token")) {
                return error(code);
            }
            let media = field("media_id").and_then(|id| shared.core.read().media.get(&id).cloned());
            let Some(media) = media else {
                return error(40007);
            };
            let mut r = Response::new(axum::body::Body::from(media.bytes));
            if let Ok(v) = HeaderValue::from_str(&media.content_type) {
                r.headers_mut().insert(header::CONTENT_TYPE, v);
            }
            r
        }
        (&Method::GET, "/cgi-bin/gettoken") => {
            if field("corpid").as_deref() != Some(shared.corp_id.as_str()) {
                return error(40013);
            }
            if field("corpsecret").as_deref() != Some(shared.secret.as_str()) {
                return error(40001);
            }
            let mut st = shared.core.change();
            st.tokens += 1;
            let token = format!("fake-access-token-{}-{:x}", st.tokens, st.tokens * 7919);
            st.issued.insert(token.clone());
            json_response(
                200,
                &json!({"errcode": 0, "errmsg": "ok", "access_token": token, "expires_in": 7200}),
            )
        }
        (&Method::POST, "/cgi-bin/message/send") => {
            if let Err(code) = check_token(&shared, field("access_token")) {
                return error(code);
            }
            if let Some(Failure::Code(code)) = failure {
                return error(code);
            }
            let Some(body) = json else {
                return json_response(
                    200,
                    &json!({"errcode": 47001, "errmsg": "data format error"}),
                );
            };
            if body["agentid"].as_i64() != Some(shared.agent_id) {
                return error(40056);
            }
            let msgtype = body["msgtype"].as_str().unwrap_or("").to_owned();
            if matches!(msgtype.as_str(), "image" | "voice" | "video" | "file") {
                // A media message names media uploaded as its own type.
                let id = body[msgtype.as_str()]["media_id"].as_str().unwrap_or("");
                let known = shared
                    .core
                    .read()
                    .media
                    .get(id)
                    .is_some_and(|m| m.kind == msgtype);
                if !known {
                    return error(40007);
                }
            }
            let content = match msgtype.as_str() {
                "text" => body["text"]["content"].as_str(),
                "markdown" => body["markdown"]["content"].as_str(),
                "image" | "voice" | "video" | "file" => body[msgtype.as_str()]["media_id"].as_str(),
                _ => None,
            }
            .unwrap_or("")
            .to_owned();
            if content.is_empty() {
                return error(44004);
            }
            if content.len() > MAX_CONTENT_BYTES {
                return error(45002);
            }
            let touser = body["touser"].as_str().unwrap_or("").to_owned();
            if touser.is_empty() {
                return json_response(200, &json!({"errcode": 40003, "errmsg": "invalid userid"}));
            }
            let mut st = shared.core.change();
            let msgid = format!("msg-{}", st.sent.len() + 1);
            st.sent.push(SentWecom {
                touser,
                msgtype,
                content,
                msgid: msgid.clone(),
                at: Instant::now(),
            });
            json_response(
                200,
                &json!({"errcode": 0, "errmsg": "ok", "invaliduser": "", "msgid": msgid}),
            )
        }
        _ => json_response(404, &json!({"errcode": 404, "errmsg": "not found"})),
    }
}

/// 41001 without a token, 42001 for an expired one, 40014 for one never
/// issued.
fn check_token(shared: &Shared, token: Option<String>) -> Result<(), i64> {
    let Some(token) = token.filter(|t| !t.is_empty()) else {
        return Err(41001);
    };
    let st = shared.core.read();
    if st.expired.contains(&token) {
        return Err(42001);
    }
    if !st.issued.contains(&token) {
        return Err(40014);
    }
    Ok(())
}

/// The formats and largest size of each upload `type` (`None`: any format).
fn upload_rule(kind: &str) -> Option<(Option<&'static [&'static str]>, usize)> {
    const MB: usize = 1024 * 1024;
    match kind {
        "image" => Some((Some(&["jpg", "jpeg", "png"]), 10 * MB)),
        "voice" => Some((Some(&["amr"]), 2 * MB)),
        "video" => Some((Some(&["mp4"]), 10 * MB)),
        "file" => Some((None, 20 * MB)),
        _ => None,
    }
}

async fn upload(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    multipart: Result<Multipart, MultipartRejection>,
) -> Response {
    let query: Vec<(String, String)> = form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    let field = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    shared.core.record(Request {
        method: "POST".into(),
        path: "/cgi-bin/media/upload".into(),
        query: query.clone(),
        body: None,
        at: Instant::now(),
    });
    if let Err(code) = check_token(&shared, field("access_token")) {
        return error(code);
    }
    let kind = field("type").unwrap_or_default();
    let Some((formats, max)) = upload_rule(&kind) else {
        return error(40004);
    };
    let Ok(mut multipart) = multipart else {
        return json_response(
            200,
            &json!({"errcode": 47001, "errmsg": "data format error"}),
        );
    };
    let mut media = None;
    while let Ok(Some(part)) = multipart.next_field().await {
        if part.name() == Some("media") {
            let name = part.file_name().unwrap_or("").to_owned();
            let content_type = part
                .content_type()
                .unwrap_or("application/octet-stream")
                .to_owned();
            if let Ok(bytes) = part.bytes().await {
                media = Some((name, content_type, bytes.to_vec()));
            }
        }
    }
    let Some((file_name, content_type, bytes)) = media.filter(|(n, _, _)| !n.is_empty()) else {
        return json_response(
            200,
            &json!({"errcode": 41005, "errmsg": "media data missing"}),
        );
    };
    let ext = file_name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    if formats.is_some_and(|f| !f.contains(&ext.as_str())) {
        return error(40005);
    }
    if bytes.len() <= 5 || bytes.len() > max {
        return error(40006);
    }
    let mut st = shared.core.change();
    st.next_media += 1;
    let media_id = format!(
        "3{}-upload-{kind}-{:x}",
        st.next_media,
        st.next_media * 7_877
    );
    st.media.insert(
        media_id.clone(),
        Media {
            kind: kind.clone(),
            content_type,
            bytes: bytes.clone(),
        },
    );
    st.uploads.push(UploadedMedia {
        kind: kind.clone(),
        file_name,
        bytes,
        media_id: media_id.clone(),
    });
    json_response(
        200,
        &json!({
            "errcode": 0, "errmsg": "ok", "type": kind,
            "media_id": media_id, "created_at": now_secs().to_string(),
        }),
    )
}

/// The XML of a media message (`image`, `voice`, `video`, `file`) from
/// `from`; `extra` holds the type's own elements (`<PicUrl>`, `<Format>`,
/// ...).
pub fn media_xml(
    corp_id: &str,
    agent_id: i64,
    from: &str,
    msg_type: &str,
    media_id: &str,
    extra: &str,
    msg_id: &str,
) -> String {
    format!(
        "<xml><ToUserName><![CDATA[{corp_id}]]></ToUserName><FromUserName><![CDATA[{from}]]>\
         </FromUserName><CreateTime>{}</CreateTime><MsgType><![CDATA[{msg_type}]]></MsgType>\
         <MediaId><![CDATA[{media_id}]]></MediaId>{extra}<MsgId>{msg_id}</MsgId>\
         <AgentID>{agent_id}</AgentID></xml>",
        now_secs()
    )
}

/// The sending side of an app's callback (see the module docs).
#[derive(Debug, Clone)]
pub struct Callback {
    /// The corp id: the receive id inside each ciphertext.
    pub corp_id: String,
    /// The app's AgentId.
    pub agent_id: i64,
    /// The callback Token.
    pub token: String,
    /// The 43-character EncodingAESKey.
    pub encoding_aes_key: String,
}

/// One signed, encrypted delivery: the query string and the XML body.
#[derive(Debug, Clone)]
pub struct Signed {
    /// `msg_signature`.
    pub msg_signature: String,
    /// `timestamp`.
    pub timestamp: String,
    /// `nonce`.
    pub nonce: String,
    /// The ciphertext (`Encrypt`, or the GET's `echostr`).
    pub encrypted: String,
}

impl Signed {
    /// The POST's query string.
    pub fn query(&self) -> String {
        form_urlencoded::Serializer::new(String::new())
            .append_pair("msg_signature", &self.msg_signature)
            .append_pair("timestamp", &self.timestamp)
            .append_pair("nonce", &self.nonce)
            .finish()
    }

    /// The URL verification's query string (the ciphertext as `echostr`).
    pub fn verify_query(&self) -> String {
        format!(
            "{}&{}",
            self.query(),
            form_urlencoded::Serializer::new(String::new())
                .append_pair("echostr", &self.encrypted)
                .finish()
        )
    }
}

/// The seconds since the epoch.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `msg_signature`: SHA-1 of the four strings sorted and joined.
pub fn signature(token: &str, timestamp: &str, nonce: &str, encrypted: &str) -> String {
    let mut parts = [token, timestamp, nonce, encrypted];
    parts.sort();
    hex(&Sha1::digest(parts.concat().as_bytes()))
}

/// WeCom's ciphertext of `message` for `receive_id` under
/// `encoding_aes_key`, with `random` as the 16 leading bytes, encrypted by
/// the `openssl` command line.
///
/// # Panics
/// When the key is not 43 characters of base64 or `openssl` fails.
pub fn encrypt(
    encoding_aes_key: &str,
    random: [u8; 16],
    message: &[u8],
    receive_id: &str,
) -> String {
    // The key's last character may carry bits past the 32nd byte.
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    );
    let key = lenient
        .decode(format!("{encoding_aes_key}="))
        .expect("an EncodingAESKey is base64");
    assert_eq!(key.len(), 32, "an EncodingAESKey decodes to 32 bytes");
    let mut plain = random.to_vec();
    plain.extend_from_slice(&(message.len() as u32).to_be_bytes());
    plain.extend_from_slice(message);
    plain.extend_from_slice(receive_id.as_bytes());
    // PKCS#7 with WeCom's 32-byte block: always 1..=32 bytes.
    let pad = 32 - plain.len() % 32;
    plain.extend(std::iter::repeat_n(pad as u8, pad));
    BASE64.encode(openssl_aes(&key, &plain))
}

/// AES-256-CBC without padding by `openssl enc`, IV = the key's first 16
/// bytes.
fn openssl_aes(key: &[u8], plain: &[u8]) -> Vec<u8> {
    let mut child = Command::new("openssl")
        .args([
            "enc",
            "-aes-256-cbc",
            "-nopad",
            "-K",
            &hex(key),
            "-iv",
            &hex(&key[..16]),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the openssl command line runs");
    let mut stdin = child.stdin.take().expect("openssl's stdin");
    let input = plain.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let output = child.wait_with_output().expect("openssl finishes");
    writer
        .join()
        .expect("the writer thread")
        .expect("openssl takes the plaintext");
    assert!(
        output.status.success(),
        "openssl enc failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// The XML of a text message from `from` to the app.
pub fn text_xml(corp_id: &str, agent_id: i64, from: &str, content: &str, msg_id: &str) -> String {
    format!(
        "<xml><ToUserName><![CDATA[{corp_id}]]></ToUserName><FromUserName><![CDATA[{from}]]>\
         </FromUserName><CreateTime>{}</CreateTime><MsgType><![CDATA[text]]></MsgType>\
         <Content><![CDATA[{content}]]></Content><MsgId>{msg_id}</MsgId><AgentID>{agent_id}</AgentID></xml>",
        now_secs()
    )
}

impl Callback {
    /// Encrypts and signs `message` for this app's corp, timestamped now.
    pub fn seal(&self, message: &str, nonce: &str) -> Signed {
        self.seal_for(message, &self.corp_id, &now_secs().to_string(), nonce)
    }

    /// Encrypts `message` for `receive_id` and signs it with `timestamp`.
    pub fn seal_for(
        &self,
        message: &str,
        receive_id: &str,
        timestamp: &str,
        nonce: &str,
    ) -> Signed {
        let mut random = [0u8; 16];
        for (i, b) in nonce
            .bytes()
            .chain(std::iter::repeat(b'r'))
            .take(16)
            .enumerate()
        {
            random[i] = b.wrapping_add(i as u8);
        }
        let encrypted = encrypt(
            &self.encoding_aes_key,
            random,
            message.as_bytes(),
            receive_id,
        );
        Signed {
            msg_signature: signature(&self.token, timestamp, nonce, &encrypted),
            timestamp: timestamp.to_owned(),
            nonce: nonce.to_owned(),
            encrypted,
        }
    }

    /// The outer XML WeCom posts around a ciphertext.
    pub fn envelope(&self, signed: &Signed) -> String {
        format!(
            "<xml><ToUserName><![CDATA[{}]]></ToUserName><AgentID><![CDATA[{}]]></AgentID>\
             <Encrypt><![CDATA[{}]]></Encrypt></xml>",
            self.corp_id, self.agent_id, signed.encrypted
        )
    }
}
