//! The `feishu_*` tools, with the ancestor's names and arguments: read a
//! docx document's text, and list, reply to and add comments on Feishu /
//! Lark documents, as the app (tenant token) the Feishu platform is
//! configured with.
//!
//! They use the adapter's own client ([`FeishuClient`]), so a gateway
//! running both holds one tenant token. Every token and id that goes into
//! a URL path is checked to be Feishu's shape (letters, digits, `_`, `-`),
//! so no argument can reach another API path; `file_type` is one of
//! Feishu's names. Document text and comments are written by other people,
//! so their output is marked untrusted, and it is bounded: a long document
//! is cut with a note saying so.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_agent::tools::{Tool, ToolContext, ToolError, ToolResult};
use talaria_platforms::feishu::{FeishuApiError, FeishuClient, FeishuError, FeishuSettings};

/// Most characters of a document `feishu_doc_read` returns.
pub const MAX_DOCUMENT_CHARS: usize = 20_000;

/// Most characters any other tool result holds.
pub const MAX_OUTPUT_CHARS: usize = 8_000;

/// The longest comment or reply accepted, in characters (the adapter's
/// own comment replies are cut at the same length).
pub const MAX_COMMENT_CHARS: usize = 4_000;

/// Longest token or id accepted.
const MAX_ID_LEN: usize = 128;

/// The document types the comment APIs name.
const FILE_TYPES: &[&str] = &["doc", "docx", "sheet", "file", "slides", "bitable"];

/// Feishu's code for a thread that takes no replies (whole-document or
/// solved comments).
const NO_THREAD_REPLY: i64 = 1_069_302;

/// The tools, talking to Feishu as the configured app.
///
/// # Errors
/// An empty credential, or an HTTP client that cannot be built.
pub fn feishu_tools(settings: &FeishuSettings) -> Result<Vec<Arc<dyn Tool>>, FeishuError> {
    let client = Arc::new(FeishuClient::new(settings)?);
    Ok(vec![
        Arc::new(DocRead(client.clone())),
        Arc::new(ListComments(client.clone())),
        Arc::new(ListReplies(client.clone())),
        Arc::new(ReplyComment(client.clone())),
        Arc::new(AddComment(client)),
    ])
}

/// A Feishu token or id: ASCII letters, digits, `_` and `-`.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A required token argument.
fn token_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) => Err(ToolError::new(format!("`{name}` is required"))),
        Some(Value::String(s)) => {
            let s = s.trim();
            if is_token(s) {
                Ok(s)
            } else {
                Err(ToolError::new(format!(
                    "`{name}` must be a Feishu token (letters, digits, _ or -), got {s:?}"
                )))
            }
        }
        Some(_) => Err(ToolError::new(format!("`{name}` must be a string"))),
    }
}

/// `file_type`, `docx` when not given.
fn file_type_arg(args: &Value) -> Result<&str, ToolError> {
    match args.get("file_type") {
        None | Some(Value::Null) => Ok("docx"),
        Some(Value::String(s)) if s.trim().is_empty() => Ok("docx"),
        Some(Value::String(s)) if FILE_TYPES.contains(&s.trim()) => Ok(s.trim()),
        Some(other) => Err(ToolError::new(format!(
            "`file_type` must be one of {}, got {other}",
            FILE_TYPES.join(", ")
        ))),
    }
}

/// `page_size`, 1 to 100, 100 when not given.
fn page_size_arg(args: &Value) -> Result<String, ToolError> {
    match args.get("page_size") {
        None | Some(Value::Null) => Ok("100".to_owned()),
        Some(v) => match v.as_u64() {
            Some(n @ 1..=100) => Ok(n.to_string()),
            _ => Err(ToolError::new(format!(
                "`page_size` must be a whole number from 1 to 100, got {v}"
            ))),
        },
    }
}

/// `page_token`, when given: Feishu's opaque paging token.
fn page_token_arg(args: &Value) -> Result<Option<&str>, ToolError> {
    match args.get("page_token") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) if s.len() <= 512 && !s.chars().any(char::is_control) => {
            Ok(Some(s.trim()))
        }
        Some(_) => Err(ToolError::new(
            "`page_token` must be the page_token a previous list answered",
        )),
    }
}

/// The text to post: required, not blank, at most [`MAX_COMMENT_CHARS`].
fn content_arg(args: &Value) -> Result<&str, ToolError> {
    let text = match args.get("content") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.trim(),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(ToolError::new(
                "`content` is required and must not be blank",
            ));
        }
        Some(_) => return Err(ToolError::new("`content` must be a string")),
    };
    let chars = text.chars().count();
    if chars > MAX_COMMENT_CHARS {
        return Err(ToolError::new(format!(
            "`content` is {chars} characters; a comment takes at most {MAX_COMMENT_CHARS}: \
             shorten it or split it over several replies"
        )));
    }
    Ok(text)
}

/// A refusal as the model should read it, with what usually causes it.
fn explain(e: &FeishuApiError, what: &str) -> ToolError {
    let hint = match e.code() {
        Some(99_991_672 | 99_991_679) => {
            " (the app lacks a permission scope: the operator must grant it in the developer \
             console and publish a new version)"
        }
        Some(1_770_032 | 1_069_304 | 91_204 | 91_403) => {
            " (the app may not see this document: it must be shared with the app, or the bot \
             added as a collaborator)"
        }
        Some(1_770_002 | 1_069_303 | 91_402) => " (no such document or comment: check the token)",
        Some(NO_THREAD_REPLY) => {
            " (this comment thread takes no replies: whole-document and solved comments \
             cannot be answered in thread; use feishu_drive_add_comment instead)"
        }
        _ => "",
    };
    ToolError::new(format!("cannot {what}: {e}{hint}"))
}

/// `text` cut to `max` characters, saying so and how to get the rest.
fn bounded(text: String, max: usize, how: &str) -> String {
    let total = text.chars().count();
    if total <= max {
        return text;
    }
    let mut cut: String = text.chars().take(max).collect();
    cut.push_str(&format!(
        "\n[cut: showing {max} of {total} characters; {how}]"
    ));
    cut
}

/// The text of a reply's elements: text runs, links, and mentions (as
/// `@<user id>`), on one line.
fn reply_text(reply: &Value) -> String {
    let mut text = String::new();
    for el in reply
        .pointer("/content/elements")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let part = match el.get("type").and_then(Value::as_str) {
            Some("text_run") => el.pointer("/text_run/text").and_then(Value::as_str),
            Some("docs_link") => el.pointer("/docs_link/url").and_then(Value::as_str),
            Some("person") => {
                // Spaced apart from the words around it; runs of space are
                // folded below.
                if let Some(id) = el.pointer("/person/user_id").and_then(Value::as_str) {
                    text.push_str(&format!(" @{id} "));
                }
                None
            }
            _ => None,
        };
        text.push_str(part.unwrap_or(""));
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// One reply as a line: `reply <id> by <user>: <text>`.
fn reply_line(reply: &Value) -> String {
    format!(
        "reply {} by {}: {}",
        str_of(reply, "reply_id"),
        match str_of(reply, "user_id") {
            "" => "?",
            who => who,
        },
        reply_text(reply).trim()
    )
}

/// The paging line that ends a list.
fn next_page(data: &Value) -> Option<String> {
    let more = data
        .get("has_more")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let token = str_of(data, "page_token");
    (more && !token.is_empty()).then(|| format!("more: call again with page_token {token:?}"))
}

struct DocRead(Arc<FeishuClient>);

#[async_trait]
impl Tool for DocRead {
    fn name(&self) -> &str {
        "feishu_doc_read"
    }

    fn description(&self) -> &str {
        "Read the full content of a Feishu/Lark document (docx) as plain text. Useful when you \
         need more context beyond the quoted text in a comment."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "doc_token": {
                    "type": "string",
                    "description": "The document token (from the document URL or comment context)."
                }
            },
            "required": ["doc_token"]
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    fn untrusted_output(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> ToolResult {
        let token = token_arg(&args, "doc_token")?;
        let path = format!("/open-apis/docx/v1/documents/{token}/raw_content");
        let data = self
            .0
            .get(&path, &[("lang", "0")])
            .await
            .map_err(|e| explain(&e, &format!("read the document {token}")))?;
        let Some(content) = data.get("content").and_then(Value::as_str) else {
            return Err(ToolError::new(
                "Feishu's answer holds no document content (is it a docx document?)",
            ));
        };
        if content.trim().is_empty() {
            return Ok("(the document is empty)".to_owned());
        }
        Ok(bounded(
            content.to_owned(),
            MAX_DOCUMENT_CHARS,
            "the rest of the document is not shown",
        ))
    }
}

struct ListComments(Arc<FeishuClient>);

#[async_trait]
impl Tool for ListComments {
    fn name(&self) -> &str {
        "feishu_drive_list_comments"
    }

    fn description(&self) -> &str {
        "List comments on a Feishu document, with their replies. Use is_whole=true to list \
         whole-document comments only."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "file_token": {"type": "string", "description": "The document file token."},
                "file_type": {"type": "string", "description": "File type (default: docx).", "default": "docx"},
                "is_whole": {"type": "boolean", "description": "If true, only return whole-document comments.", "default": false},
                "page_size": {"type": "integer", "description": "Number of comments per page (max 100).", "default": 100},
                "page_token": {"type": "string", "description": "Pagination token for next page."}
            },
            "required": ["file_token"]
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    fn untrusted_output(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> ToolResult {
        let token = token_arg(&args, "file_token")?;
        let file_type = file_type_arg(&args)?;
        let page_size = page_size_arg(&args)?;
        let page_token = page_token_arg(&args)?;
        let whole = match args.get("is_whole") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ToolError::new("`is_whole` must be true or false")),
        };
        let mut query = vec![
            ("file_type", file_type),
            ("user_id_type", "open_id"),
            ("page_size", page_size.as_str()),
        ];
        if whole {
            query.push(("is_whole", "true"));
        }
        if let Some(t) = page_token {
            query.push(("page_token", t));
        }
        let path = format!("/open-apis/drive/v1/files/{token}/comments");
        let data = self
            .0
            .get(&path, &query)
            .await
            .map_err(|e| explain(&e, &format!("list the comments on {token}")))?;
        let items = data.get("items").and_then(Value::as_array);
        let mut lines = Vec::new();
        for item in items.into_iter().flatten() {
            let scope = if item.get("is_whole").and_then(Value::as_bool) == Some(true) {
                "whole-document"
            } else {
                "local"
            };
            let state = if item.get("is_solved").and_then(Value::as_bool) == Some(true) {
                "solved"
            } else {
                "open"
            };
            let mut line = format!("comment {} ({scope}, {state})", str_of(item, "comment_id"));
            let quote = str_of(item, "quote");
            if !quote.is_empty() {
                line.push_str(&format!(" on {quote:?}"));
            }
            lines.push(line);
            for reply in item
                .pointer("/reply_list/replies")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                lines.push(format!("  {}", reply_line(reply)));
            }
        }
        if lines.is_empty() {
            lines.push("no comments".to_owned());
        }
        lines.extend(next_page(&data));
        Ok(bounded(
            lines.join("\n"),
            MAX_OUTPUT_CHARS,
            "ask for a smaller page_size",
        ))
    }
}

struct ListReplies(Arc<FeishuClient>);

#[async_trait]
impl Tool for ListReplies {
    fn name(&self) -> &str {
        "feishu_drive_list_comment_replies"
    }

    fn description(&self) -> &str {
        "List all replies in a comment thread on a Feishu document."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "file_token": {"type": "string", "description": "The document file token."},
                "comment_id": {"type": "string", "description": "The comment ID to list replies for."},
                "file_type": {"type": "string", "description": "File type (default: docx).", "default": "docx"},
                "page_size": {"type": "integer", "description": "Number of replies per page (max 100).", "default": 100},
                "page_token": {"type": "string", "description": "Pagination token for next page."}
            },
            "required": ["file_token", "comment_id"]
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    fn untrusted_output(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> ToolResult {
        let token = token_arg(&args, "file_token")?;
        let comment = token_arg(&args, "comment_id")?;
        let file_type = file_type_arg(&args)?;
        let page_size = page_size_arg(&args)?;
        let page_token = page_token_arg(&args)?;
        let mut query = vec![
            ("file_type", file_type),
            ("user_id_type", "open_id"),
            ("page_size", page_size.as_str()),
        ];
        if let Some(t) = page_token {
            query.push(("page_token", t));
        }
        let path = format!("/open-apis/drive/v1/files/{token}/comments/{comment}/replies");
        let data = self.0.get(&path, &query).await.map_err(|e| {
            explain(
                &e,
                &format!("list the replies to comment {comment} on {token}"),
            )
        })?;
        let mut lines: Vec<String> = data
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(reply_line)
            .collect();
        if lines.is_empty() {
            lines.push("no replies".to_owned());
        }
        lines.extend(next_page(&data));
        Ok(bounded(
            lines.join("\n"),
            MAX_OUTPUT_CHARS,
            "ask for a smaller page_size",
        ))
    }
}

struct ReplyComment(Arc<FeishuClient>);

#[async_trait]
impl Tool for ReplyComment {
    fn name(&self) -> &str {
        "feishu_drive_reply_comment"
    }

    fn description(&self) -> &str {
        "Reply to a local comment thread on a Feishu document. Use this for local (quoted-text) \
         comments. For whole-document comments, use feishu_drive_add_comment instead."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "file_token": {"type": "string", "description": "The document file token."},
                "comment_id": {"type": "string", "description": "The comment ID to reply to."},
                "content": {"type": "string", "description": "The reply text content (plain text only, no markdown)."},
                "file_type": {"type": "string", "description": "File type (default: docx).", "default": "docx"}
            },
            "required": ["file_token", "comment_id", "content"]
        })
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> ToolResult {
        let token = token_arg(&args, "file_token")?;
        let comment = token_arg(&args, "comment_id")?;
        let text = content_arg(&args)?;
        let file_type = file_type_arg(&args)?;
        let body = json!({"content": {"elements": [
            {"type": "text_run", "text_run": {"text": text}}
        ]}});
        let path = format!("/open-apis/drive/v1/files/{token}/comments/{comment}/replies");
        let data = self
            .0
            .post(&path, &[("file_type", file_type)], &body)
            .await
            .map_err(|e| explain(&e, &format!("reply to comment {comment} on {token}")))?;
        Ok(format!(
            "replied to comment {comment} (reply {})",
            match str_of(&data, "reply_id") {
                "" => "id not given",
                id => id,
            }
        ))
    }
}

struct AddComment(Arc<FeishuClient>);

#[async_trait]
impl Tool for AddComment {
    fn name(&self) -> &str {
        "feishu_drive_add_comment"
    }

    fn description(&self) -> &str {
        "Add a new whole-document comment on a Feishu document. Use this for whole-document \
         comments or as a fallback when reply_comment fails with code 1069302."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "file_token": {"type": "string", "description": "The document file token."},
                "content": {"type": "string", "description": "The comment text content (plain text only, no markdown)."},
                "file_type": {"type": "string", "description": "File type (default: docx).", "default": "docx"}
            },
            "required": ["file_token", "content"]
        })
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> ToolResult {
        let token = token_arg(&args, "file_token")?;
        let text = content_arg(&args)?;
        let file_type = file_type_arg(&args)?;
        let body = json!({
            "file_type": file_type,
            "reply_elements": [{"type": "text", "text": text}],
        });
        let path = format!("/open-apis/drive/v1/files/{token}/new_comments");
        let data = self
            .0
            .post(&path, &[], &body)
            .await
            .map_err(|e| explain(&e, &format!("comment on {token}")))?;
        Ok(format!(
            "added a whole-document comment on {token} (comment {})",
            match str_of(&data, "comment_id") {
                "" => "id not given",
                id => id,
            }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_types_are_checked() {
        assert!(is_token("doxcnABC_12-x"));
        for bad in ["", "a/b", "../x", "a?b", "a b", "ünï"] {
            assert!(!is_token(bad), "{bad}");
        }
        assert_eq!(file_type_arg(&json!({})).unwrap(), "docx");
        assert_eq!(
            file_type_arg(&json!({"file_type": "sheet"})).unwrap(),
            "sheet"
        );
        assert!(file_type_arg(&json!({"file_type": "docx/../x"})).is_err());
        assert_eq!(page_size_arg(&json!({})).unwrap(), "100");
        assert!(page_size_arg(&json!({"page_size": 0})).is_err());
        assert!(page_size_arg(&json!({"page_size": 101})).is_err());
        assert!(content_arg(&json!({"content": "  "})).is_err());
        let long = "x".repeat(MAX_COMMENT_CHARS + 1);
        assert!(content_arg(&json!({"content": long})).is_err());
    }

    #[test]
    fn long_text_is_cut_with_a_note() {
        let cut = bounded("abcdef".to_owned(), 3, "more later");
        assert!(cut.starts_with("abc\n[cut: showing 3 of 6 characters; more later]"));
        assert_eq!(bounded("abc".to_owned(), 3, "x"), "abc");
    }

    #[test]
    fn replies_read_runs_links_and_mentions() {
        let reply = json!({"reply_id": "r1", "user_id": "ou_a", "content": {"elements": [
            {"type": "person", "person": {"user_id": "ou_b"}},
            {"type": "text_run", "text_run": {"text": " see "}},
            {"type": "docs_link", "docs_link": {"url": "https://x/doc"}},
        ]}});
        assert_eq!(
            reply_line(&reply),
            "reply r1 by ou_a: @ou_b see https://x/doc"
        );
    }
}
