//! What a send puts on the wire: the event content (Markdown as body and
//! sanitized HTML, threads and replies) and the transaction id that makes
//! a retried send land once.

use super::*;

impl MatrixAdapter {
    /// The transaction id for a send of `message`.
    ///
    /// The same message gets the same id until a send of it succeeds, so
    /// the ledger's retry of a send that timed out (and may have arrived)
    /// is deduplicated by the homeserver. Once it succeeded, sending the
    /// same text again is a new message and gets the next sequence number.
    /// The per-process nonce keeps ids from an earlier run (whose
    /// sequence numbers started over) from colliding; a reply recovered
    /// after a crash carries the recovery line, so it is a new text anyway.
    pub(super) fn txn_for(&self, message: &OutboundMessage) -> (String, String) {
        let mut h = Sha256::new();
        for part in [
            message.chat_id.as_str(),
            message.thread_id.as_deref().unwrap_or(""),
            message.reply_to.as_deref().unwrap_or(""),
            message.text.as_str(),
        ] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        let digest: String = h
            .finalize()
            .iter()
            .take(12)
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut txns = lock(&self.txns);
        if txns.len() >= MAX_REMEMBERED {
            txns.retain(|_, (_, pending)| *pending);
        }
        let seq = match txns.get_mut(&digest) {
            Some((seq, pending)) if *pending => *seq,
            Some((seq, pending)) => {
                *seq += 1;
                *pending = true;
                *seq
            }
            None => {
                txns.insert(digest.clone(), (0, true));
                0
            }
        };
        (format!("talaria.{}.{digest}.{seq}", self.nonce), digest)
    }

    pub(super) fn txn_done(&self, digest: &str) {
        if let Some((_, pending)) = lock(&self.txns).get_mut(digest) {
            *pending = false;
        }
    }

    /// The content of a message event for `message`.
    pub(super) fn content(message: &OutboundMessage) -> Result<Value, SendError> {
        let mut content = json!({
            "msgtype": "m.text",
            "body": message.text,
            "format": "org.matrix.custom.html",
            "formatted_body": format::to_html(&message.text),
        });
        relate(
            &mut content,
            message.thread_id.as_deref(),
            message.reply_to.as_deref(),
        );
        fit(content)
    }

    pub(super) async fn own_user_id(&self) -> Result<String, SendError> {
        if let Some(u) = self.user_id() {
            return Ok(u);
        }
        let v: Value = self
            .api
            .request(Method::GET, "/account/whoami", &[], None, REQUEST_TIMEOUT)
            .await
            .map_err(classify)?;
        v.get("user_id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| SendError::Transient("whoami answered without a user_id".into()))
    }
}

/// Puts `content` in the thread rooted at `thread`, or makes it a reply
/// to `reply_to`.
pub(super) fn relate(content: &mut Value, thread: Option<&str>, reply_to: Option<&str>) {
    match (thread, reply_to) {
        (Some(root), reply) => {
            content["m.relates_to"] = json!({
                "rel_type": "m.thread",
                "event_id": root,
                "is_falling_back": true,
                "m.in_reply_to": { "event_id": reply.unwrap_or(root) },
            });
        }
        (None, Some(reply)) => {
            content["m.relates_to"] = json!({ "m.in_reply_to": { "event_id": reply } });
        }
        (None, None) => {}
    }
}

/// `content` within what an event carries: the HTML dropped when the
/// whole is too large, refused when even that is.
pub(super) fn fit(content: Value) -> Result<Value, SendError> {
    fit_within(content, MAX_CONTENT_BYTES)
}

/// [`fit`] under another limit (an encrypted event's plaintext).
pub(super) fn fit_within(mut content: Value, limit: usize) -> Result<Value, SendError> {
    if content.to_string().len() > limit {
        if let Some(obj) = content.as_object_mut() {
            obj.remove("format");
            obj.remove("formatted_body");
        }
        let size = content.to_string().len();
        if size > limit {
            return Err(SendError::Rejected(format!(
                "the message is {size} bytes, more than a Matrix event can carry"
            )));
        }
    }
    Ok(content)
}
