//! The fake Yuanbao's files: resources users sent (exchanged for a direct
//! address at `/api/resource/v1/download`), and uploads (`genUploadInfo`
//! hands out a location and temporary credentials; a local stand-in for
//! Tencent COS takes the `PUT` and checks its signature).
//!
//! The COS signature is checked the way Tencent's documentation describes
//! it ("Request Signature", COS XML API), computed here on its own:
//! `SignKey = hex(HMAC-SHA1(SecretKey, KeyTime))`; the query parameters and
//! the headers named in `q-header-list`, each key lower-cased, keys and
//! values URL-encoded, sorted, joined `k=v&…`; `HttpString = method + "\n" +
//! path + "\n" + params + "\n" + headers + "\n"`; `StringToSign = "sha1\n" +
//! KeyTime + "\n" + hex(SHA1(HttpString)) + "\n"`; the signature is
//! `hex(HMAC-SHA1(SignKey, StringToSign))`. The fake insists that `host`
//! and `x-cos-security-token` are among the signed headers and that the
//! token is the one it issued with the credentials.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha1::{Digest, Sha1};

use super::{BOT_ID, Shared};
use crate::json_response;

/// One file a user sent, waiting to be fetched.
#[derive(Debug, Clone)]
struct Resource {
    bytes: Vec<u8>,
}

/// One `genUploadInfo` answer: where to put a file and with what.
#[derive(Debug, Clone)]
struct Grant {
    location: String,
    secret_id: String,
    secret_key: String,
    token: String,
    start: u64,
    end: u64,
    resource_url: String,
}

/// One `PUT` the stand-in COS received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CosPut {
    /// The request path, decoded.
    pub path: String,
    /// Whether it was taken.
    pub accepted: bool,
    /// Why not, when it was not.
    pub why: String,
    /// Its headers (lower-cased names), to replay it.
    pub headers: Vec<(String, String)>,
}

/// One call to the download endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadCall {
    /// The resource asked for.
    pub resource_id: String,
    /// The HTTP status answered.
    pub status: u16,
}

/// A media element of a message the bot sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentMedia {
    /// `TIMImageElem` or `TIMFileElem`.
    pub msg_type: String,
    /// The address the element points at.
    pub url: String,
    /// The file name (file elements).
    pub name: Option<String>,
    /// The size the element claims.
    pub size: u32,
    /// The image format claimed (image elements).
    pub image_format: u32,
    /// The image's width and height claimed (image elements).
    pub dims: (u32, u32),
}

#[derive(Debug, Default)]
pub(super) struct Files {
    next: u64,
    resources: HashMap<String, Resource>,
    grants: Vec<Grant>,
    objects: HashMap<String, Vec<u8>>,
    puts: Vec<CosPut>,
    downloads: Vec<DownloadCall>,
    served: Vec<String>,
    /// The download endpoint names this address instead of its own.
    redirect: Option<String>,
}

impl Files {
    /// The bytes uploaded under `resource_url`, once their `PUT` was taken.
    pub(super) fn uploaded(&self, resource_url: &str) -> Option<Vec<u8>> {
        let grant = self
            .grants
            .iter()
            .find(|g| g.resource_url == resource_url)?;
        self.objects.get(&grant.location).cloned()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// URL-encoding as COS documents it: unreserved characters stay.
fn cos_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `%XX` sequences decoded (the request path as the object key).
fn unescape(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = text.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hmac_sha1(key: &[u8], message: &[u8]) -> String {
    let mut mac = match Hmac::<Sha1>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(message);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `k=v&…` of `pairs` as COS signs them, and the `;`-joined key list.
fn signed_pairs(pairs: &[(String, String)]) -> (String, String) {
    let sorted: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (cos_escape(&k.to_lowercase()), cos_escape(v)))
        .collect();
    let joined: Vec<String> = sorted.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let keys: Vec<&str> = sorted.keys().map(String::as_str).collect();
    (joined.join("&"), keys.join(";"))
}

/// The signature COS expects for a request.
pub fn cos_signature(
    secret_key: &str,
    key_time: &str,
    method: &str,
    path: &str,
    params: &[(String, String)],
    headers: &[(String, String)],
) -> String {
    let sign_key = hmac_sha1(secret_key.as_bytes(), key_time.as_bytes());
    let (params, _) = signed_pairs(params);
    let (headers, _) = signed_pairs(headers);
    let http_string = format!("{}\n{path}\n{params}\n{headers}\n", method.to_lowercase());
    let digest: String = Sha1::digest(http_string.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let string_to_sign = format!("sha1\n{key_time}\n{digest}\n");
    hmac_sha1(sign_key.as_bytes(), string_to_sign.as_bytes())
}

impl super::FakeYuanbao {
    /// Stores `bytes` as a file a user sent; returns the protected address
    /// an element carries (`…?resourceId=<id>`).
    pub fn add_resource(&self, bytes: &[u8]) -> String {
        let mut st = self.shared.core.change();
        st.files.next += 1;
        let id = format!("res-{:05}", st.files.next);
        st.files.resources.insert(
            id.clone(),
            Resource {
                bytes: bytes.to_vec(),
            },
        );
        format!(
            "http://{}/api/resource/download?resourceId={id}",
            self.shared.addr
        )
    }

    /// From now on the download endpoint names `url` as every file's
    /// address (to test where the adapter agrees to fetch from).
    pub fn name_download_address(&self, url: &str) {
        self.shared.core.change().files.redirect = Some(url.to_owned());
    }

    /// Forgets every token issued: calls carrying one are refused with 401
    /// (as when a token lapses on the platform's side).
    pub fn expire_tokens(&self) {
        self.shared.core.change().tokens.clear();
    }

    /// Every call to the download endpoint.
    pub fn download_calls(&self) -> Vec<DownloadCall> {
        self.shared.core.read().files.downloads.clone()
    }

    /// Every `PUT` the stand-in COS received.
    pub fn cos_puts(&self) -> Vec<CosPut> {
        self.shared.core.read().files.puts.clone()
    }

    /// Paths of files served (`/yb-res/…`, `/yb-cdn/…`).
    pub fn served(&self) -> Vec<String> {
        self.shared.core.read().files.served.clone()
    }

    /// The bytes uploaded for `resource_url`, once taken.
    pub fn uploaded(&self, resource_url: &str) -> Option<Vec<u8>> {
        self.shared.core.read().files.uploaded(resource_url)
    }

    /// The address of the stand-in COS, for `platforms.yuanbao.cos_endpoint`.
    pub fn cos_endpoint(&self) -> String {
        format!("http://{}", self.shared.addr)
    }
}

/// Whether the headers carry a token this fake issued and the bot's id.
fn authorised(shared: &Shared, headers: &HeaderMap) -> Result<(), (u16, &'static str)> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let st = shared.core.read();
    if !st.tokens.contains(&header("x-token")) {
        return Err((401, "token expired or unknown"));
    }
    if header("x-id") != BOT_ID {
        return Err((403, "X-ID is not the bot"));
    }
    if header("x-source").is_empty() {
        return Err((400, "X-Source missing"));
    }
    Ok(())
}

pub(super) async fn upload_info(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err((status, why)) = authorised(&shared, &headers) {
        return json_response(status, &json!({"code": status, "msg": why}));
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let field = |k: &str| body.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let (name, file_id) = (field("fileName"), field("fileId"));
    if name.is_empty() || file_id.is_empty() || field("docFrom") != "localDoc" {
        return json_response(
            200,
            &json!({"code": 40001, "msg": "fileName, fileId and docFrom=localDoc are required"}),
        );
    }
    let mut st = shared.core.change();
    st.files.next += 1;
    let n = st.files.next;
    let now = now();
    let grant = Grant {
        location: format!("yb-cos/{n}/{name}"),
        secret_id: format!("AKIDtmp{n:05}"),
        secret_key: format!("tmp-secret-key-{n:05}"),
        token: format!("session-token/{n:05}+x="),
        start: now - 5,
        end: now + 1800,
        resource_url: format!("http://{}/yb-cdn/{n}", shared.addr),
    };
    let answer = json!({
        "code": 0, "msg": "ok",
        "data": {
            "bucketName": "yb-bucket-1250000000",
            "region": "ap-guangzhou",
            "location": grant.location,
            "encryptTmpSecretId": grant.secret_id,
            "encryptTmpSecretKey": grant.secret_key,
            "encryptToken": grant.token,
            "startTime": grant.start,
            "expiredTime": grant.end,
            "resourceUrl": grant.resource_url,
        },
    });
    st.files.grants.push(grant);
    json_response(200, &answer)
}

fn cos_error(status: u16, code: &str) -> Response {
    let xml = format!("<?xml version=\"1.0\"?><Error><Code>{code}</Code></Error>");
    let mut response = (
        axum::http::StatusCode::from_u16(status)
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR),
        xml,
    )
        .into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/xml"),
    );
    response
}

/// Checks one `PUT` against the grant for its path; `Err` says why not.
fn check_put(
    grant: &Grant,
    path: &str,
    uri: &Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(), String> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let auth = header("authorization").ok_or("no Authorization")?;
    let fields: HashMap<&str, &str> = auth.split('&').filter_map(|p| p.split_once('=')).collect();
    let get = |k: &str| fields.get(k).copied().unwrap_or("");
    if get("q-sign-algorithm") != "sha1" {
        return Err("q-sign-algorithm is not sha1".into());
    }
    if get("q-ak") != grant.secret_id {
        return Err("q-ak is not the temporary secret id".into());
    }
    let key_time = get("q-key-time");
    if get("q-sign-time") != key_time {
        return Err("q-sign-time differs from q-key-time".into());
    }
    let (start, end) = key_time
        .split_once(';')
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
        .ok_or("q-key-time is not start;end")?;
    let now = now();
    if start > now || end < now || start < grant.start.saturating_sub(60) || end > grant.end {
        return Err("the signature's time is outside the credentials'".into());
    }
    if header("x-cos-security-token").as_deref() != Some(grant.token.as_str()) {
        return Err("x-cos-security-token is not the session token".into());
    }
    let listed: Vec<&str> = get("q-header-list")
        .split(';')
        .filter(|s| !s.is_empty())
        .collect();
    for must in ["host", "x-cos-security-token"] {
        if !listed.contains(&must) {
            return Err(format!("{must} is not signed"));
        }
    }
    let mut signed_headers = Vec::new();
    for name in &listed {
        let value = header(name).ok_or_else(|| format!("signed header {name} is missing"))?;
        signed_headers.push((name.to_string(), value));
    }
    let params: Vec<(String, String)> = uri
        .query()
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default();
    let (_, param_list) = signed_pairs(&params);
    if get("q-url-param-list") != param_list {
        return Err("q-url-param-list does not match the query".into());
    }
    let (_, header_list) = signed_pairs(&signed_headers);
    if get("q-header-list") != header_list {
        return Err("q-header-list is not lower-case and sorted".into());
    }
    let expected = cos_signature(
        &grant.secret_key,
        key_time,
        "put",
        path,
        &params,
        &signed_headers,
    );
    if get("q-signature") != expected {
        return Err("SignatureDoesNotMatch".into());
    }
    if let Some(length) = header("content-length")
        && length.parse::<usize>().ok() != Some(body.len())
    {
        return Err("Content-Length differs from the body".into());
    }
    Ok(())
}

pub(super) async fn cos_put(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = unescape(uri.path());
    let location = path.trim_start_matches('/').to_owned();
    let recorded: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let mut st = shared.core.change();
    let Some(grant) = st
        .files
        .grants
        .iter()
        .find(|g| g.location == location)
        .cloned()
    else {
        st.files.puts.push(CosPut {
            path,
            accepted: false,
            why: "no such location".into(),
            headers: recorded,
        });
        return cos_error(404, "NoSuchKey");
    };
    match check_put(&grant, &path, &uri, &headers, &body) {
        Ok(()) => {
            st.files.puts.push(CosPut {
                path,
                accepted: true,
                why: String::new(),
                headers: recorded,
            });
            st.files.objects.insert(grant.location, body.to_vec());
            let mut response = axum::http::StatusCode::OK.into_response();
            response.headers_mut().insert(
                "etag",
                axum::http::HeaderValue::from_static("\"fake-etag\""),
            );
            response
        }
        Err(why) => {
            st.files.puts.push(CosPut {
                path,
                accepted: false,
                why: why.clone(),
                headers: recorded,
            });
            cos_error(
                403,
                if why == "SignatureDoesNotMatch" {
                    "SignatureDoesNotMatch"
                } else {
                    "AccessDenied"
                },
            )
        }
    }
}

pub(super) async fn download(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let id = query.get("resourceId").cloned().unwrap_or_default();
    let verdict = authorised(&shared, &headers);
    let mut st = shared.core.change();
    let (status, answer) = match verdict {
        Err((status, why)) => (status, json!({"code": status, "msg": why})),
        Ok(()) if !st.files.resources.contains_key(&id) => {
            (200, json!({"code": 404, "msg": "no such resource"}))
        }
        Ok(()) => {
            let url = st
                .files
                .redirect
                .clone()
                .unwrap_or_else(|| format!("http://{}/yb-res/{id}", shared.addr));
            (
                200,
                json!({"code": 0, "msg": "ok", "data": {"realUrl": url}}),
            )
        }
    };
    st.files.downloads.push(DownloadCall {
        resource_id: id,
        status,
    });
    json_response(status, &answer)
}

pub(super) async fn resource(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    let mut st = shared.core.change();
    st.files.served.push(format!("/yb-res/{id}"));
    match st.files.resources.get(&id) {
        Some(r) => r.bytes.clone().into_response(),
        None => axum::http::StatusCode::NOT_FOUND.into_response(),
    }
}

pub(super) async fn cdn(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(n): axum::extract::Path<String>,
) -> Response {
    let mut st = shared.core.change();
    st.files.served.push(format!("/yb-cdn/{n}"));
    let url = format!("http://{}/yb-cdn/{n}", shared.addr);
    match st.files.uploaded(&url) {
        Some(bytes) => bytes.into_response(),
        None => axum::http::StatusCode::NOT_FOUND.into_response(),
    }
}

/// The media elements of a sent body, checked: each must point at an
/// upload this fake took. `Err` says what is wrong.
pub(super) fn sent_media(
    files: &Files,
    body: &[super::wire::MsgBodyElement],
) -> Result<Vec<SentMedia>, String> {
    let mut out = Vec::new();
    for element in body {
        let content = element.msg_content.clone().unwrap_or_default();
        let media = match element.msg_type.as_str() {
            "TIMImageElem" => {
                let info = content
                    .image_info_array
                    .first()
                    .ok_or("an image element without image_info_array")?;
                SentMedia {
                    msg_type: element.msg_type.clone(),
                    url: info.url.clone(),
                    name: None,
                    size: info.size,
                    image_format: content.image_format,
                    dims: (info.width, info.height),
                }
            }
            "TIMFileElem" => SentMedia {
                msg_type: element.msg_type.clone(),
                url: content.url.clone(),
                name: Some(content.file_name.clone()).filter(|n| !n.is_empty()),
                size: content.file_size,
                image_format: 0,
                dims: (0, 0),
            },
            _ => continue,
        };
        if content.uuid.is_empty() {
            return Err("a media element without uuid".into());
        }
        let bytes = files
            .uploaded(&media.url)
            .ok_or_else(|| format!("{} points at no upload", media.url))?;
        if bytes.len() != media.size as usize {
            return Err("the element's size is not the upload's".into());
        }
        if media.msg_type == "TIMFileElem" && media.name.is_none() {
            return Err("a file element without file_name".into());
        }
        out.push(media);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_matches_one_computed_by_python() {
        let headers = vec![
            ("host".to_owned(), "127.0.0.1:4000".to_owned()),
            ("content-type".to_owned(), "image/png".to_owned()),
        ];
        let ours = cos_signature("sk", "10;20", "PUT", "/a/b c.png", &[], &headers);
        let script = "import hmac,hashlib\n\
            sk=hmac.new(b'sk',b'10;20',hashlib.sha1).hexdigest()\n\
            hs='put\\n/a/b c.png\\n\\ncontent-type=image%2Fpng&host=127.0.0.1%3A4000\\n'\n\
            sts='sha1\\n10;20\\n'+hashlib.sha1(hs.encode()).hexdigest()+'\\n'\n\
            print(hmac.new(sk.encode(),sts.encode(),hashlib.sha1).hexdigest())";
        let out = std::process::Command::new("python3")
            .args(["-c", script])
            .output()
            .expect("python3 runs");
        assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), ours);
    }

    #[test]
    fn paths_are_decoded() {
        assert_eq!(unescape("/a%20b/%E6%8A%A5.pdf"), "/a b/报.pdf");
        assert_eq!(unescape("/100%"), "/100%");
    }
}
