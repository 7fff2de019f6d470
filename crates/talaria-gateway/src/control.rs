//! The gateway's control socket: `$TALARIA_HOME/gateway.sock`, a Unix
//! socket only its owner can open (mode 0600), through which `talaria send`
//! hands a message to the running gateway, so it goes out over the
//! gateway's live connections and through its ledger.
//!
//! The protocol is one JSON object per line each way: a request
//! `{"op": "send", "target": "...", "text": "..."}` and an answer
//! `{"ok": true, "detail": "..."}` or `{"ok": false, "error": "..."}`.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use crate::delivery::Delivery;
use crate::messenger::send_to_target;

/// The largest request line accepted, in bytes.
const MAX_REQUEST: u64 = 1024 * 1024;

/// How long one connection may take, end to end (a send included).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(120);

/// A request on the socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Sends `text` to `target` (the delivery-target grammar).
    Send {
        /// Where to send, in the delivery-target grammar
        /// (`telegram`, `telegram:12345`, ...).
        target: String,
        /// The message text.
        text: String,
    },
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// Whether the request was carried out.
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// What was done, for the user (the delivery target, ...).
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Why the request failed, when `ok` is false.
    pub error: Option<String>,
}

impl Response {
    fn ok(detail: String) -> Response {
        Response {
            ok: true,
            detail: Some(detail),
            error: None,
        }
    }

    fn error(error: impl Into<String>) -> Response {
        Response {
            ok: false,
            detail: None,
            error: Some(error.into()),
        }
    }
}

/// Listens on `path` until `shutdown`, then removes the socket file.
///
/// The caller must hold the home's PID file: a socket file left by a dead
/// gateway is replaced, which is only safe when no other gateway can be
/// using it.
pub async fn serve(
    path: PathBuf,
    delivery: Delivery,
    shutdown: CancellationToken,
) -> io::Result<()> {
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(&path)?;
    // The home is private already; this makes the socket so even where the
    // home's mode was loosened.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    tracing::info!(path = %path.display(), "control socket listening");
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "control socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let delivery = delivery.clone();
        tokio::spawn(async move {
            if tokio::time::timeout(CONNECTION_TIMEOUT, handle(stream, &delivery))
                .await
                .is_err()
            {
                tracing::warn!("control socket: a connection took too long and was dropped");
            }
        });
    }
    let _ = std::fs::remove_file(&path);
    Ok(())
}

async fn handle(stream: UnixStream, delivery: &Delivery) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(MAX_REQUEST));
    let response = match reader.read_line(&mut line).await {
        Ok(0) => return,
        Ok(_) if !line.ends_with('\n') => {
            Response::error("the request is too large or not terminated by a newline")
        }
        Ok(_) => match serde_json::from_str::<Request>(line.trim_end()) {
            Ok(request) => answer(request, delivery).await,
            Err(e) => Response::error(format!("not a valid request: {e}")),
        },
        Err(e) => Response::error(format!("cannot read the request: {e}")),
    };
    let mut out = serde_json::to_vec(&response).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
    out.push(b'\n');
    let _ = write.write_all(&out).await;
}

async fn answer(request: Request, delivery: &Delivery) -> Response {
    match request {
        Request::Send { target, text } => {
            let response = send(delivery, &target, &text).await;
            match (&response.detail, &response.error) {
                (Some(detail), _) => {
                    tracing::info!("a message from the control socket was {detail}")
                }
                (_, Some(error)) => {
                    tracing::info!(%error, "a message from the control socket was not sent")
                }
                _ => {}
            }
            response
        }
    }
}

/// Sends `text` to `target` through `delivery` and its ledger. `origin`
/// has no chat to point at here, so it means `local`.
pub async fn send(delivery: &Delivery, target: &str, text: &str) -> Response {
    match send_to_target(delivery, target, None, text).await {
        Ok(detail) => Response::ok(detail),
        Err(error) => Response::error(error),
    }
}

/// Why a request through the socket did not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No gateway listens on the socket.
    #[error("no gateway is listening on {}", .0.display())]
    NotRunning(PathBuf),
    /// Connecting, writing or reading the socket failed.
    #[error("the gateway's control socket failed: {0}")]
    Io(#[from] io::Error),
    /// The answer was not a [`Response`] (a gateway of another version?).
    #[error("the gateway gave an answer that is not understood: {0}")]
    Protocol(String),
}

/// Sends `request` to the gateway listening on `path` and returns its
/// answer.
pub async fn request(path: &Path, request: &Request) -> Result<Response, ClientError> {
    let mut stream = match UnixStream::connect(path).await {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Err(ClientError::NotRunning(path.to_path_buf()));
        }
        Err(e) => return Err(e.into()),
    };
    let mut line = serde_json::to_vec(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
    line.push(b'\n');
    stream.write_all(&line).await?;
    let mut answer = String::new();
    let read = tokio::time::timeout(
        CONNECTION_TIMEOUT,
        BufReader::new(stream.take(MAX_REQUEST)).read_line(&mut answer),
    )
    .await
    .map_err(|_| ClientError::Protocol("no answer in time".into()))??;
    if read == 0 {
        return Err(ClientError::Protocol(
            "the gateway closed the connection".into(),
        ));
    }
    serde_json::from_str(answer.trim_end()).map_err(|e| ClientError::Protocol(e.to_string()))
}
