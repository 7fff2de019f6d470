//! Files both ways.
//!
//! In: an image, file, voice or video element names where its bytes are.
//! A URL carrying a `resourceId` is Yuanbao's own protected address: it is
//! exchanged at `GET {api}/api/resource/v1/download?resourceId=…` (the
//! bot's token in `X-Token`, signed again once on a 401) for a direct one.
//! Any other URL is fetched as it is. Either way the address must be under
//! the API's own origin or one of the configured media hosts (an element's
//! URL comes from whoever sent the message), redirects are not followed,
//! and the body is streamed to the gateway.
//!
//! Out: `POST {api}/api/resource/genUploadInfo` hands out a Tencent COS
//! location and temporary credentials; the file is streamed there with a
//! `PUT` signed as COS documents it (HMAC-SHA1 over the method, the path,
//! the query and the chosen headers, `q-sign-algorithm=sha1`) with the
//! session token in `x-cos-security-token`; then the message carries an
//! image or file element pointing at the upload's `resourceUrl`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha1::{Digest, Sha1};
use talaria_adapter::{Download, DownloadError, MediaKind, OutboundFile, SendError};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::YuanbaoAdapter;
use super::proto::{ImageInfo, MsgBodyElement, MsgContent};
use super::sign::SignError;

/// The largest file sent: the platform takes up to 50 MB.
pub(super) const MAX_UPLOAD: u64 = 50 << 20;
/// Where protected resources are exchanged for a direct address.
const DOWNLOAD_PATH: &str = "/api/resource/v1/download";
/// Where upload locations and credentials are handed out.
const UPLOAD_INFO_PATH: &str = "/api/resource/genUploadInfo";
/// How long one transfer (download or upload, body included) may take.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(600);
/// The largest JSON answer read from the resource endpoints.
const MAX_ANSWER: usize = 64 << 10;
/// How much of a file is read to tell its image format and size.
const SNIFF: usize = 64 << 10;
/// What an element's locator starts with: a protected resource's id, or
/// an address fetched as it is.
const RESOURCE: &str = "rid:";
const URL: &str = "url:";

/// The locator of an element's `url`: `rid:<id>` for Yuanbao's protected
/// addresses (a `resourceId` in the query), `url:<url>` for others;
/// `None` for what is no http(s) URL.
pub(super) fn locator(url: &str) -> Option<String> {
    let parsed = reqwest::Url::parse(url.trim()).ok()?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return None;
    }
    if let Some((_, id)) = parsed.query_pairs().find(|(k, _)| k == "resourceId")
        && !id.trim().is_empty()
    {
        return Some(format!("{RESOURCE}{}", id.trim()));
    }
    Some(format!("{URL}{parsed}"))
}

/// Which addresses files may be fetched from.
#[derive(Debug, Clone)]
pub(super) struct HostGuard {
    /// The API's scheme, host and port: always allowed.
    api: (String, String, Option<u16>),
    /// Host names allowed over https, each also for its subdomains.
    hosts: Vec<String>,
}

impl HostGuard {
    pub(super) fn new(api_domain: &str, hosts: &[String]) -> HostGuard {
        let api = reqwest::Url::parse(api_domain)
            .ok()
            .map(|u| {
                (
                    u.scheme().to_owned(),
                    u.host_str().unwrap_or("").to_ascii_lowercase(),
                    u.port_or_known_default(),
                )
            })
            .unwrap_or_default();
        HostGuard {
            api,
            hosts: hosts
                .iter()
                .map(|h| h.trim().trim_start_matches('.').to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
        }
    }

    /// `url`, parsed, when it may be fetched; why not otherwise.
    pub(super) fn check(&self, url: &str) -> Result<reqwest::Url, String> {
        let parsed =
            reqwest::Url::parse(url).map_err(|_| "the file's address is not a URL".to_owned())?;
        let host = parsed.host_str().unwrap_or("").to_ascii_lowercase();
        let same_api = parsed.scheme() == self.api.0
            && host == self.api.1
            && parsed.port_or_known_default() == self.api.2;
        let listed = parsed.scheme() == "https"
            && parsed.port_or_known_default() == Some(443)
            && self
                .hosts
                .iter()
                .any(|h| host == *h || host.ends_with(&format!(".{h}")));
        if (same_api || listed) && parsed.username().is_empty() && parsed.password().is_none() {
            Ok(parsed)
        } else {
            Err(format!(
                "the file is at {host:?}, which is neither the Yuanbao API nor a configured media \
                 host (platforms.yuanbao.media_hosts); not fetched"
            ))
        }
    }
}

/// COS's URL encoding: everything but `A-Z a-z 0-9 - _ . ~` as `%XX`.
fn cos_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn hmac_sha1_hex(key: &[u8], message: &str) -> String {
    // HMAC takes a key of any length; this cannot fail.
    let Ok(mut mac) = Hmac::<Sha1>::new_from_slice(key) else {
        return String::new();
    };
    mac.update(message.as_bytes());
    talaria_core::ids::to_hex(&mac.finalize().into_bytes())
}

/// `key1=value1&key2=…` and `key1;key2;…` of pairs, keys lower-cased and
/// both encoded, in key order: COS's HttpParameters / HttpHeaders and
/// their lists.
fn canonical(pairs: &[(&str, &str)]) -> (String, String) {
    let mut encoded: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (cos_encode(&k.to_ascii_lowercase()), cos_encode(v)))
        .collect();
    encoded.sort();
    let joined = encoded
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let list = encoded
        .iter()
        .map(|(k, _)| k.clone())
        .collect::<Vec<_>>()
        .join(";");
    (joined, list)
}

/// What a COS request is signed over.
pub(super) struct CosRequest<'a> {
    /// `put`, `get`, ...
    pub method: &'a str,
    /// The path, not URL-encoded (`/folder/name.png`).
    pub path: &'a str,
    /// Query parameters.
    pub params: &'a [(&'a str, &'a str)],
    /// The headers signed.
    pub headers: &'a [(&'a str, &'a str)],
}

/// The `Authorization` value for `request`, signed with a (temporary)
/// secret id and key valid for `key_time` (`start;end`, Unix seconds).
pub(super) fn cos_authorization(
    secret_id: &str,
    secret_key: &str,
    key_time: &str,
    request: &CosRequest<'_>,
) -> String {
    let sign_key = hmac_sha1_hex(secret_key.as_bytes(), key_time);
    let (parameters, param_list) = canonical(request.params);
    let (headers, header_list) = canonical(request.headers);
    let http_string = format!(
        "{}\n{}\n{parameters}\n{headers}\n",
        request.method.to_ascii_lowercase(),
        request.path
    );
    let digest = talaria_core::ids::to_hex(&Sha1::digest(http_string.as_bytes()));
    let string_to_sign = format!("sha1\n{key_time}\n{digest}\n");
    let signature = hmac_sha1_hex(sign_key.as_bytes(), &string_to_sign);
    format!(
        "q-sign-algorithm=sha1&q-ak={secret_id}&q-sign-time={key_time}&q-key-time={key_time}\
         &q-header-list={header_list}&q-url-param-list={param_list}&q-signature={signature}"
    )
}

/// An image's element format (1 JPEG, 2 GIF, 3 PNG, 4 BMP) and, where the
/// header says, its width and height; `None` for what is none of those.
pub(super) fn image_format(head: &[u8]) -> Option<(u32, Option<(u32, u32)>)> {
    let be16 = |b: &[u8], i: usize| {
        b.get(i..i + 2)
            .map(|s| (u32::from(s[0]) << 8) | u32::from(s[1]))
    };
    let le16 = |b: &[u8], i: usize| {
        b.get(i..i + 2)
            .map(|s| (u32::from(s[1]) << 8) | u32::from(s[0]))
    };
    let be32 = |b: &[u8], i: usize| {
        b.get(i..i + 4)
            .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    };
    let le32 = |b: &[u8], i: usize| {
        b.get(i..i + 4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    };
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        let size = be32(head, 16).zip(be32(head, 20));
        return Some((3, size));
    }
    if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        return Some((2, le16(head, 6).zip(le16(head, 8))));
    }
    if head.starts_with(b"BM") && head.len() >= 26 {
        let h = le32(head, 22).map(|h| (h as i32).unsigned_abs());
        return Some((4, le32(head, 18).zip(h)));
    }
    if head.starts_with(&[0xFF, 0xD8, 0xFF]) {
        // Walk the segments to the frame header (SOF0..SOF15 but the
        // DHT, JPG and DAC markers), which holds the height and width.
        let mut i = 2;
        let mut size = None;
        while i + 9 < head.len() {
            if head[i] != 0xFF {
                break;
            }
            let marker = head[i + 1];
            if marker == 0xFF {
                i += 1;
                continue;
            }
            let frame = (0xC0..=0xCF).contains(&marker) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
            if frame {
                size = be16(head, i + 7).zip(be16(head, i + 5));
                break;
            }
            let Some(len) = be16(head, i + 2) else { break };
            i += 2 + len as usize;
        }
        return Some((1, size));
    }
    None
}

/// A file uploaded, ready for its element.
#[derive(Debug, Clone)]
pub(super) struct Uploaded {
    /// Where the platform serves it.
    pub url: String,
    /// The id given to the upload (the element's `uuid`).
    pub uuid: String,
    /// Its size.
    pub size: u64,
    /// Its image format and dimensions, for an image sent as one.
    pub image: Option<(u32, Option<(u32, u32)>)>,
}

/// The element that shows `upload` of `file`: an image, or a file.
pub(super) fn element(file: &OutboundFile, upload: &Uploaded) -> MsgBodyElement {
    let size = u32::try_from(upload.size).unwrap_or(u32::MAX);
    match upload.image {
        Some((format, dims)) => {
            let (width, height) = dims.unwrap_or((0, 0));
            MsgBodyElement {
                msg_type: "TIMImageElem".into(),
                msg_content: Some(MsgContent {
                    uuid: upload.uuid.clone(),
                    image_format: format,
                    image_info_array: vec![ImageInfo {
                        r#type: 1,
                        size,
                        width,
                        height,
                        url: upload.url.clone(),
                    }],
                    ..MsgContent::default()
                }),
            }
        }
        None => MsgBodyElement {
            msg_type: "TIMFileElem".into(),
            msg_content: Some(MsgContent {
                uuid: upload.uuid.clone(),
                url: upload.url.clone(),
                file_size: size,
                file_name: file.name.clone(),
                ..MsgContent::default()
            }),
        },
    }
}

/// The temporary COS credentials and location of one upload.
struct UploadInfo {
    bucket: String,
    region: String,
    location: String,
    secret_id: String,
    secret_key: talaria_core::Secret,
    session_token: talaria_core::Secret,
    start: u64,
    end: u64,
    resource_url: String,
}

fn field<'a>(data: &'a Value, name: &str) -> &'a str {
    data.get(name).and_then(Value::as_str).unwrap_or("").trim()
}

fn number(data: &Value, name: &str) -> u64 {
    match data.get(name) {
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
        Some(Value::String(s)) => s.trim().parse().unwrap_or(0),
        _ => 0,
    }
}

/// A bucket name COS could have: lowercase letters, digits and dashes.
fn bucket_ok(b: &str) -> bool {
    !b.is_empty()
        && b.len() <= 64
        && b.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
}

/// An object key that stays one object: no empty, `.` or `..` segment,
/// no control characters or backslashes.
fn location_ok(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 1024
        && !l.chars().any(|c| c.is_control() || c == '\\')
        && l.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A short, credential-free excerpt of an error answer.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl YuanbaoAdapter {
    /// A GET of a resource endpoint with the headers every such call
    /// carries: the bot, its token, its source, the route environment.
    async fn resource_get(&self, url: &str, renew: bool) -> Result<reqwest::Response, String> {
        let token = self.token(renew).await.map_err(|e| e.to_string())?;
        let bot = self
            .bot_id()
            .unwrap_or_else(|| self.settings.app_key.expose().to_owned());
        let mut request = self
            .http
            .get(url)
            .timeout(self.settings.request_timeout)
            .header("X-ID", bot)
            .header("X-Token", token.token.expose())
            .header("X-Source", &token.source);
        if let Some(env) = &self.settings.route_env {
            request = request.header("X-Route-Env", env);
        }
        request
            .send()
            .await
            .map_err(|e| format!("cannot reach Yuanbao: {}", e.without_url()))
    }

    /// A protected resource's direct address.
    async fn resolve(&self, resource_id: &str) -> Result<String, DownloadError> {
        let mut url = reqwest::Url::parse(&format!("{}{DOWNLOAD_PATH}", self.settings.api_domain))
            .map_err(|e| DownloadError::Unavailable(e.to_string()))?;
        url.query_pairs_mut().append_pair("resourceId", resource_id);
        let mut renewed = false;
        loop {
            let response = self
                .resource_get(url.as_str(), renewed)
                .await
                .map_err(DownloadError::Unavailable)?;
            let status = response.status().as_u16();
            if status == 401 && !renewed {
                // The token may have lapsed on the platform's side first.
                renewed = true;
                continue;
            }
            let body = response
                .bytes()
                .await
                .map_err(|e| DownloadError::Unavailable(e.without_url().to_string()))?;
            if body.len() > MAX_ANSWER {
                return Err(DownloadError::Unavailable(
                    "the download answer is too large".into(),
                ));
            }
            if !(200..300).contains(&status) {
                let why = format!("HTTP {status}: {}", excerpt(&body));
                return Err(match status {
                    401 | 403 | 404 | 410 => DownloadError::Gone(why),
                    _ => DownloadError::Unavailable(why),
                });
            }
            let answer: Value = serde_json::from_slice(&body).map_err(|e| {
                DownloadError::Unavailable(format!("unreadable download answer: {e}"))
            })?;
            let code = answer.get("code").and_then(Value::as_i64).unwrap_or(0);
            if code != 0 {
                let msg = field(&answer, "msg");
                let msg = if msg.is_empty() {
                    field(&answer, "message")
                } else {
                    msg
                };
                return Err(DownloadError::Gone(format!(
                    "Yuanbao refused the download (code {code}): {}",
                    msg.chars().take(200).collect::<String>()
                )));
            }
            let data = answer.get("data").unwrap_or(&Value::Null);
            let direct = [
                field(data, "url"),
                field(data, "realUrl"),
                field(&answer, "realUrl"),
            ]
            .into_iter()
            .find(|u| !u.is_empty())
            .ok_or_else(|| DownloadError::Gone("Yuanbao named no address for the file".into()))?;
            return Ok(direct.to_owned());
        }
    }

    /// Opens the file `locator` names, streamed.
    pub(super) async fn open_file(&self, locator: &str) -> Result<Download, DownloadError> {
        let address = if let Some(id) = locator.strip_prefix(RESOURCE) {
            self.resolve(id).await?
        } else if let Some(url) = locator.strip_prefix(URL) {
            url.to_owned()
        } else {
            return Err(DownloadError::Gone(format!(
                "{locator:?} is not a Yuanbao file"
            )));
        };
        let url = self.guard.check(&address).map_err(DownloadError::Gone)?;
        let response = self
            .http
            .get(url)
            .timeout(TRANSFER_TIMEOUT)
            .send()
            .await
            .map_err(|e| DownloadError::Unavailable(e.without_url().to_string()))?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            let why = format!("the file's host answered HTTP {status}");
            return Err(match status {
                403 | 404 | 410 => DownloadError::Gone(why),
                413 => DownloadError::TooLarge(why),
                _ => DownloadError::Unavailable(why),
            });
        }
        let length = response.content_length();
        let body = response
            .bytes_stream()
            .map(|chunk| chunk.map_err(|e| std::io::Error::other(e.without_url().to_string())));
        Ok(Download {
            reader: Box::pin(tokio_util::io::StreamReader::new(body)),
            length,
        })
    }

    /// `genUploadInfo`: where to put one file, and the credentials.
    async fn upload_info(&self, name: &str, file_id: &str) -> Result<UploadInfo, SendError> {
        let mut renewed = false;
        let url = format!("{}{UPLOAD_INFO_PATH}", self.settings.api_domain);
        let body = json!({
            "fileName": name, "fileId": file_id, "docFrom": "localDoc", "docOpenId": "",
        });
        loop {
            let token = self.token(renewed).await.map_err(|e| match e {
                SignError::Refused { .. } => SendError::Rejected(e.to_string()),
                SignError::Unreachable(_) => SendError::Unavailable(e.to_string()),
            })?;
            let bot = self
                .bot_id()
                .unwrap_or_else(|| self.settings.app_key.expose().to_owned());
            let mut request = self
                .http
                .post(&url)
                .timeout(self.settings.request_timeout)
                .header("X-ID", bot)
                .header("X-Token", token.token.expose())
                .header("X-Source", "web")
                .json(&body);
            if let Some(env) = &self.settings.route_env {
                request = request.header("X-Route-Env", env);
            }
            let response = request.send().await.map_err(|e| {
                SendError::Unavailable(format!("cannot reach Yuanbao: {}", e.without_url()))
            })?;
            let status = response.status().as_u16();
            if status == 401 && !renewed {
                renewed = true;
                continue;
            }
            let bytes = response
                .bytes()
                .await
                .map_err(|e| SendError::Transient(e.without_url().to_string()))?;
            if bytes.len() > MAX_ANSWER {
                return Err(SendError::Transient(
                    "the upload-info answer is too large".into(),
                ));
            }
            if !(200..300).contains(&status) {
                let why = format!("genUploadInfo answered HTTP {status}: {}", excerpt(&bytes));
                return Err(if status >= 500 || status == 429 {
                    SendError::Transient(why)
                } else {
                    SendError::Rejected(why)
                });
            }
            let answer: Value = serde_json::from_slice(&bytes).map_err(|e| {
                SendError::Transient(format!("unreadable genUploadInfo answer: {e}"))
            })?;
            let code = answer.get("code").and_then(Value::as_i64).unwrap_or(0);
            if code != 0 {
                return Err(SendError::Transient(format!(
                    "genUploadInfo refused (code {code}): {}",
                    field(&answer, "msg").chars().take(200).collect::<String>()
                )));
            }
            let data = answer.get("data").unwrap_or(&answer);
            let info = UploadInfo {
                bucket: field(data, "bucketName").to_owned(),
                region: field(data, "region").to_owned(),
                location: field(data, "location").trim_start_matches('/').to_owned(),
                secret_id: field(data, "encryptTmpSecretId").to_owned(),
                secret_key: talaria_core::Secret::new(field(data, "encryptTmpSecretKey")),
                session_token: talaria_core::Secret::new(field(data, "encryptToken")),
                start: number(data, "startTime"),
                end: number(data, "expiredTime"),
                resource_url: field(data, "resourceUrl").to_owned(),
            };
            if !bucket_ok(&info.bucket)
                || !location_ok(&info.location)
                || info.secret_id.is_empty()
                || info.secret_key.expose().is_empty()
                || info.session_token.expose().is_empty()
                || info
                    .region
                    .contains(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            {
                return Err(SendError::Transient(
                    "genUploadInfo's answer lacks a usable bucket, location or credentials".into(),
                ));
            }
            return Ok(info);
        }
    }

    /// Streams `file` to COS and returns where the platform serves it.
    pub(super) async fn upload(&self, file: &OutboundFile) -> Result<Uploaded, SendError> {
        let unreadable =
            |e: std::io::Error| SendError::Rejected(format!("cannot read {}: {e}", file.name));
        let mut handle = tokio::fs::File::open(&file.path)
            .await
            .map_err(unreadable)?;
        let size = handle.metadata().await.map_err(unreadable)?.len();
        if size > MAX_UPLOAD {
            return Err(SendError::Rejected(format!(
                "{} is {:.1} MB; Yuanbao takes files up to {} MB",
                file.name,
                size as f64 / f64::from(1u32 << 20),
                MAX_UPLOAD >> 20
            )));
        }
        if size == 0 {
            return Err(SendError::Rejected(format!("{} is empty", file.name)));
        }
        let mut head = vec![0u8; SNIFF.min(size as usize)];
        handle.read_exact(&mut head).await.map_err(unreadable)?;
        handle
            .seek(std::io::SeekFrom::Start(0))
            .await
            .map_err(unreadable)?;
        let image = match file.kind {
            MediaKind::Image => Some(image_format(&head).unwrap_or((255, None))),
            _ => None,
        };
        drop(head);

        let file_id = talaria_core::ids::to_hex(&rand::random::<[u8; 16]>());
        let info = self.upload_info(&file.name, &file_id).await?;
        let endpoint = self
            .settings
            .cos_endpoint
            .replace("{bucket}", &info.bucket)
            .replace("{region}", &info.region);
        let mut url = reqwest::Url::parse(&endpoint)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
            .ok_or_else(|| {
                SendError::Rejected(format!(
                    "platforms.yuanbao.cos_endpoint gives {endpoint:?}, which is no http(s) URL"
                ))
            })?;
        let base = url.path().trim_end_matches('/').to_owned();
        let path = format!("{base}/{}", info.location);
        let encoded: Vec<String> = path.split('/').map(cos_encode).collect();
        url.set_path(&encoded.join("/"));
        url.set_query(None);
        let host = match (url.host_str(), url.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_owned(),
            (None, _) => String::new(),
        };
        let now = now_secs();
        let start = if info.start > 0 && info.start <= now + 60 {
            info.start
        } else {
            now
        };
        let end = if info.end > now { info.end } else { now + 600 };
        let length = size.to_string();
        let mime = if file.mime.trim().is_empty() {
            "application/octet-stream"
        } else {
            file.mime.trim()
        };
        let token = info.session_token.expose();
        let authorization = cos_authorization(
            &info.secret_id,
            info.secret_key.expose(),
            &format!("{start};{end}"),
            &CosRequest {
                method: "put",
                path: &path,
                params: &[],
                headers: &[
                    ("host", &host),
                    ("content-length", &length),
                    ("content-type", mime),
                    ("x-cos-security-token", token),
                ],
            },
        );
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(handle));
        let response = self
            .http
            .put(url.clone())
            .timeout(TRANSFER_TIMEOUT)
            .header("Authorization", authorization)
            .header("Content-Length", &length)
            .header("Content-Type", mime)
            .header("x-cos-security-token", token)
            .body(body)
            .send()
            .await
            .map_err(|e| SendError::Transient(format!("the upload failed: {}", e.without_url())))?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            let body = response.bytes().await.unwrap_or_default();
            let why = format!(
                "COS answered the upload with HTTP {status}: {}",
                excerpt(&body)
            );
            // Nothing was posted yet: a retry uploads afresh.
            return Err(if status >= 500 || status == 429 {
                SendError::Transient(why)
            } else {
                SendError::Rejected(why)
            });
        }
        let resource_url = if info.resource_url.is_empty() {
            url.to_string()
        } else {
            info.resource_url
        };
        Ok(Uploaded {
            url: resource_url,
            uuid: file_id,
            size,
            image,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_urls_become_locators() {
        assert_eq!(
            locator("https://bot.yuanbao.tencent.com/api/resource/download?resourceId=ab%2Fc&x=1")
                .as_deref(),
            Some("rid:ab/c")
        );
        assert_eq!(
            locator("https://cdn.example.com/a.png").as_deref(),
            Some("url:https://cdn.example.com/a.png")
        );
        assert_eq!(locator("file:///etc/passwd"), None);
        assert_eq!(locator("not a url"), None);
    }

    #[test]
    fn only_the_api_and_the_media_hosts_are_fetched() {
        let guard = HostGuard::new("http://127.0.0.1:8080", &["myqcloud.com".into()]);
        assert!(guard.check("http://127.0.0.1:8080/cdn/x").is_ok());
        assert!(guard.check("http://127.0.0.1:8081/cdn/x").is_err());
        assert!(guard.check("https://127.0.0.1:8080/cdn/x").is_err());
        assert!(guard.check("https://b-1.cos.ap-x.myqcloud.com/k").is_ok());
        assert!(guard.check("https://myqcloud.com/k").is_ok());
        assert!(guard.check("http://b.myqcloud.com/k").is_err());
        assert!(guard.check("https://evilmyqcloud.com/k").is_err());
        assert!(guard.check("https://myqcloud.com.evil.org/k").is_err());
        assert!(guard.check("https://u:p@b.myqcloud.com/k").is_err());
        assert!(guard.check("http://169.254.169.254/latest").is_err());
    }

    #[test]
    fn cos_encoding_keeps_only_unreserved_characters() {
        assert_eq!(cos_encode("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(cos_encode("image/png"), "image%2Fpng");
        assert_eq!(cos_encode("127.0.0.1:80"), "127.0.0.1%3A80");
        assert_eq!(cos_encode("报告 1"), "%E6%8A%A5%E5%91%8A%201");
    }

    /// `hex(HMAC-SHA1)` and `hex(SHA1)` from Python's standard library,
    /// following COS's documented steps there rather than here.
    fn python_cos_signature(id: &str, key: &str, key_time: &str, http_string: &str) -> String {
        let script = "import hmac,hashlib,sys\n\
            sid,skey,kt,hs=sys.argv[1:5]\n\
            sk=hmac.new(skey.encode(),kt.encode(),hashlib.sha1).hexdigest()\n\
            sts='sha1\\n'+kt+'\\n'+hashlib.sha1(hs.encode()).hexdigest()+'\\n'\n\
            print(hmac.new(sk.encode(),sts.encode(),hashlib.sha1).hexdigest())";
        let out = std::process::Command::new("python3")
            .args(["-c", script, id, key, key_time, http_string])
            .output()
            .expect("python3 runs");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    #[test]
    fn the_cos_signature_follows_the_documented_steps() {
        let auth = cos_authorization(
            "AKIDexample",
            "secret-key-1",
            "1700000000;1700003600",
            &CosRequest {
                method: "PUT",
                path: "/bot/报告.pdf",
                params: &[("uploadId", "x y")],
                headers: &[
                    ("Host", "b-1.cos.ap-guangzhou.myqcloud.com"),
                    ("Content-Type", "application/pdf"),
                    ("x-cos-security-token", "tok/+="),
                ],
            },
        );
        // Written out by hand from the documentation's rules: lower-cased,
        // encoded, sorted; the path as it is.
        let http_string = "put\n/bot/报告.pdf\nuploadid=x%20y\n\
            content-type=application%2Fpdf&host=b-1.cos.ap-guangzhou.myqcloud.com\
            &x-cos-security-token=tok%2F%2B%3D\n";
        let expected = python_cos_signature(
            "AKIDexample",
            "secret-key-1",
            "1700000000;1700003600",
            http_string,
        );
        assert_eq!(expected.len(), 40);
        assert_eq!(
            auth,
            format!(
                "q-sign-algorithm=sha1&q-ak=AKIDexample&q-sign-time=1700000000;1700003600\
                 &q-key-time=1700000000;1700003600&q-header-list=content-type;host;\
                 x-cos-security-token&q-url-param-list=uploadid&q-signature={expected}"
            )
        );
    }

    #[test]
    fn image_formats_and_sizes_come_from_the_bytes() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend_from_slice(&64u32.to_be_bytes());
        png.extend_from_slice(&48u32.to_be_bytes());
        assert_eq!(image_format(&png), Some((3, Some((64, 48)))));
        assert_eq!(
            image_format(b"GIF89a\x0a\x00\x05\x00rest"),
            Some((2, Some((10, 5))))
        );
        // A JPEG: SOI, an APP0 segment of 16 bytes, then SOF0 (8 bits,
        // height 3, width 7).
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10];
        jpeg.extend_from_slice(&[0u8; 14]);
        jpeg.extend_from_slice(&[0xFF, 0xC0, 0x00, 0x11, 0x08, 0x00, 0x03, 0x00, 0x07, 0x03]);
        assert_eq!(image_format(&jpeg), Some((1, Some((7, 3)))));
        assert_eq!(image_format(b"%PDF-1.4"), None);
        assert_eq!(image_format(b"RIFF\0\0\0\0WEBPVP8 "), None);
    }
}
