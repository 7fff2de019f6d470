//! Document comments: `drive.notice.comment_add_v1` addressed to the bot
//! becomes a turn, and the answer a reply in the comment's thread.
//!
//! - The chat is the document, `doc:<file_type>:<file_token>`, so every
//!   comment on one document shares a session; the message id is
//!   `comment:<comment_id>:<reply_id>`, which the runner's dedupe keys on.
//! - The comment's text, its quote and the document's title are read
//!   (`comments/batch_query`, `metas/batch_query`) and put before the
//!   question; a comment not readable yet is asked for again a few times.
//! - The answer is posted with `POST …/comments/:comment_id/replies`; a
//!   thread that takes no replies (1069302: a whole-document or solved
//!   comment) gets a new whole-document comment instead.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use talaria_adapter::{ChatType, MessageEvent, SessionSource};

use super::PLATFORM;
use super::api::{Api, ApiError, NO_THREAD_REPLY};

/// The chat id prefix of a document.
pub(crate) const DOC_PREFIX: &str = "doc:";

/// How often a comment not yet readable is asked for again.
const READ_TRIES: u32 = 4;

/// One comment notice addressed to the bot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Comment {
    pub file_token: String,
    pub file_type: String,
    pub comment_id: String,
    pub reply_id: Option<String>,
    pub from_open_id: String,
}

impl Comment {
    /// Reads the event's body; `Err` says why it is not for the bot.
    pub(crate) fn from_event(event: &Value, bot_open_id: Option<&str>) -> Result<Comment, String> {
        let text = |p: &str| {
            event
                .pointer(p)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        let notice = text("/notice_meta/notice_type").unwrap_or_default();
        if !matches!(notice.as_str(), "add_comment" | "add_reply") {
            return Err(format!("a comment notice of type {notice:?}"));
        }
        let Some(bot) = bot_open_id else {
            return Err("a comment notice, but the bot's open id is unknown".into());
        };
        let from =
            text("/notice_meta/from_user_id/open_id").ok_or("a comment notice without a sender")?;
        if from == bot {
            return Err("the bot's own comment".into());
        }
        if text("/notice_meta/to_user_id/open_id").as_deref() != Some(bot) {
            return Err("a comment notice addressed to someone else".into());
        }
        let (Some(file_token), Some(file_type), Some(comment_id)) = (
            text("/notice_meta/file_token"),
            text("/notice_meta/file_type"),
            text("/comment_id"),
        ) else {
            return Err("a comment notice without file token, type or comment id".into());
        };
        let safe = |s: &str| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        if !safe(&file_token) || !safe(&file_type) || !safe(&comment_id) {
            return Err("a comment notice with unusable ids".into());
        }
        Ok(Comment {
            file_token,
            file_type,
            comment_id,
            reply_id: text("/reply_id"),
            from_open_id: from,
        })
    }

    /// The document's chat id.
    pub(crate) fn chat_id(&self) -> String {
        format!("{DOC_PREFIX}{}:{}", self.file_type, self.file_token)
    }

    /// The turn's message id.
    pub(crate) fn message_id(&self) -> String {
        format!(
            "comment:{}:{}",
            self.comment_id,
            self.reply_id.as_deref().unwrap_or("0")
        )
    }
}

/// The document a `doc:` chat id names: (file type, file token).
pub(crate) fn parse_chat(chat_id: &str) -> Option<(&str, &str)> {
    chat_id.strip_prefix(DOC_PREFIX)?.split_once(':')
}

/// The comment a turn's message id names.
pub(crate) fn parse_message(message_id: &str) -> Option<&str> {
    let rest = message_id.strip_prefix("comment:")?;
    Some(rest.split_once(':').map_or(rest, |(c, _)| c))
}

/// Reads the comment and the document and builds the turn.
pub(crate) async fn to_event(api: &Api, comment: &Comment) -> MessageEvent {
    let query = [
        ("file_type", comment.file_type.as_str()),
        ("user_id_type", "open_id"),
    ];
    let path = format!(
        "/open-apis/drive/v1/files/{}/comments/batch_query",
        comment.file_token
    );
    let body = json!({"comment_ids": [comment.comment_id]});
    let mut item = None;
    for attempt in 0..READ_TRIES {
        match api.call(Method::POST, &path, &query, Some(&body)).await {
            Ok(data) => {
                item = data
                    .pointer("/items/0")
                    .cloned()
                    .filter(|i| has_reply(i, comment.reply_id.as_deref()));
                if item.is_some() {
                    break;
                }
            }
            Err(e) => tracing::info!(error = %e, "cannot read a Feishu comment yet"),
        }
        // Comments can be unreadable for a moment after the notice.
        if attempt + 1 < READ_TRIES {
            tokio::time::sleep(Duration::from_millis(300 * u64::from(attempt + 1))).await;
        }
    }
    let title = document_title(api, comment).await;
    let (quote, said) = match &item {
        Some(i) => (
            i.get("quote")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            reply_text(i, comment.reply_id.as_deref()),
        ),
        None => (String::new(), String::new()),
    };
    let mut context = format!(
        "[A comment on the Feishu document {} ({} {})",
        title
            .as_deref()
            .map_or_else(|| "(untitled)".to_owned(), |t| format!("{t:?}")),
        comment.file_type,
        comment.file_token
    );
    if !quote.is_empty() {
        context.push_str(&format!(", on the text {quote:?}"));
    }
    context.push_str(". Your answer is posted as a reply in the comment thread.]");
    let said = if said.trim().is_empty() {
        "(the comment could not be read)".to_owned()
    } else {
        said
    };
    let source = SessionSource {
        platform: PLATFORM.to_owned(),
        chat_id: comment.chat_id(),
        chat_name: title,
        chat_type: ChatType::Group,
        user_id: Some(comment.from_open_id.clone()),
        user_name: None,
        thread_id: None,
        is_bot: false,
    };
    let mut event = MessageEvent::text(source, format!("{context}\n{}", said.trim()));
    event.message_id = Some(comment.message_id());
    event
}

fn has_reply(item: &Value, reply_id: Option<&str>) -> bool {
    match reply_id {
        None => true,
        Some(id) => replies(item).any(|r| r.get("reply_id").and_then(Value::as_str) == Some(id)),
    }
}

fn replies(item: &Value) -> impl Iterator<Item = &Value> {
    item.pointer("/reply_list/replies")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// The text of the triggering reply (or the last one): text runs, links,
/// and mentions (as the person's id; the bot's own mention dropped).
fn reply_text(item: &Value, reply_id: Option<&str>) -> String {
    let reply = replies(item)
        .find(|r| reply_id.is_some() && r.get("reply_id").and_then(Value::as_str) == reply_id)
        .or_else(|| replies(item).last());
    let Some(reply) = reply else {
        return String::new();
    };
    let mut text = String::new();
    for el in reply
        .pointer("/content/elements")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match el.get("type").and_then(Value::as_str) {
            Some("text_run") => {
                text.push_str(
                    el.pointer("/text_run/text")
                        .and_then(Value::as_str)
                        .unwrap_or(""),
                );
            }
            Some("docs_link") => {
                text.push_str(
                    el.pointer("/docs_link/url")
                        .and_then(Value::as_str)
                        .unwrap_or(""),
                );
            }
            _ => {}
        }
    }
    text
}

async fn document_title(api: &Api, comment: &Comment) -> Option<String> {
    let body = json!({
        "request_docs": [{"doc_token": comment.file_token, "doc_type": comment.file_type}],
        "with_url": true,
    });
    match api
        .call(
            Method::POST,
            "/open-apis/drive/v1/metas/batch_query",
            &[],
            Some(&body),
        )
        .await
    {
        Ok(data) => data
            .pointer("/metas/0/title")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_owned),
        Err(e) => {
            tracing::info!(error = %e, "cannot read a Feishu document's title");
            None
        }
    }
}

/// Posts `text` in the comment's thread, or as a new whole-document
/// comment when the thread takes no replies (or none is known). Returns
/// the new reply's (or comment's) id.
pub(crate) async fn reply(
    api: &Api,
    file_type: &str,
    file_token: &str,
    comment_id: Option<&str>,
    text: &str,
) -> Result<Option<String>, ApiError> {
    if let Some(comment_id) = comment_id {
        let path = format!("/open-apis/drive/v1/files/{file_token}/comments/{comment_id}/replies");
        let body = json!({"content": {"elements": [
            {"type": "text_run", "text_run": {"text": text}}
        ]}});
        match api
            .call(
                Method::POST,
                &path,
                &[("file_type", file_type)],
                Some(&body),
            )
            .await
        {
            Ok(data) => {
                return Ok(data
                    .get("reply_id")
                    .and_then(Value::as_str)
                    .map(str::to_owned));
            }
            Err(e) if e.code() == Some(NO_THREAD_REPLY) => {
                tracing::info!("the Feishu comment thread takes no replies; adding a new comment");
            }
            Err(e) => return Err(e),
        }
    }
    let path = format!("/open-apis/drive/v1/files/{file_token}/new_comments");
    let body = json!({
        "file_type": file_type,
        "reply_elements": [{"type": "text", "text": text}],
    });
    let data = api.call(Method::POST, &path, &[], Some(&body)).await?;
    Ok(data
        .get("comment_id")
        .and_then(Value::as_str)
        .map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(from: &str, to: &str, kind: &str) -> Value {
        json!({
            "comment_id": "c1", "reply_id": "r1", "is_mentioned": true,
            "notice_meta": {
                "file_token": "doxcnABC", "file_type": "docx", "notice_type": kind,
                "from_user_id": {"open_id": from}, "to_user_id": {"open_id": to},
            }
        })
    }

    #[test]
    fn only_notices_to_the_bot_from_others() {
        let c = Comment::from_event(&notice("ou_ada", "ou_bot", "add_comment"), Some("ou_bot"))
            .unwrap();
        assert_eq!(c.chat_id(), "doc:docx:doxcnABC");
        assert_eq!(c.message_id(), "comment:c1:r1");
        assert_eq!(parse_chat(&c.chat_id()), Some(("docx", "doxcnABC")));
        assert_eq!(parse_message(&c.message_id()), Some("c1"));
        for (from, to, kind) in [
            ("ou_bot", "ou_bot", "add_comment"),
            ("ou_ada", "ou_bob", "add_comment"),
            ("ou_ada", "ou_bot", "resolve_comment"),
        ] {
            assert!(Comment::from_event(&notice(from, to, kind), Some("ou_bot")).is_err());
        }
        assert!(Comment::from_event(&notice("ou_ada", "ou_bot", "add_reply"), None).is_err());
    }

    #[test]
    fn reply_text_reads_runs_and_links() {
        let item = json!({"reply_list": {"replies": [
            {"reply_id": "r0", "content": {"elements": [{"type": "text_run", "text_run": {"text": "old"}}]}},
            {"reply_id": "r1", "content": {"elements": [
                {"type": "person", "person": {"user_id": "ou_bot"}},
                {"type": "text_run", "text_run": {"text": " see "}},
                {"type": "docs_link", "docs_link": {"url": "https://x/doc"}},
            ]}},
        ]}});
        assert_eq!(reply_text(&item, Some("r1")), " see https://x/doc");
        assert!(has_reply(&item, Some("r0")));
        assert!(!has_reply(&item, Some("r9")));
    }
}
