//! Talaria as an MCP server (`talaria mcp serve`, over stdio): other
//! agents and editors search Talaria's past sessions and send messages
//! through its platforms.
//!
//! Two tools, with the arguments of the agent's own tools of the same
//! names: `session_search` (`query`, `limit`) and `send_message`
//! (`target`, `message`; `action: list` lists the targets).

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use talaria_agent::tools::send_message::Messenger;
use talaria_store::{SearchQuery, SessionStore};

/// Most sessions one search returns.
const MAX_RESULTS: u64 = 20;

/// What `talaria mcp serve` serves from.
#[derive(Clone)]
pub struct TalariaServer {
    store: Arc<dyn SessionStore>,
    messenger: Arc<dyn Messenger>,
}

impl TalariaServer {
    /// The server over `store` (for `session_search`) and `messenger` (for
    /// `send_message`).
    pub fn new(store: Arc<dyn SessionStore>, messenger: Arc<dyn Messenger>) -> TalariaServer {
        TalariaServer { store, messenger }
    }

    /// Serves over stdin and stdout until the client goes away.
    pub async fn serve_stdio(self) -> Result<(), String> {
        let running = self
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| format!("the MCP handshake failed: {e}"))?;
        running
            .waiting()
            .await
            .map(drop)
            .map_err(|e| format!("the MCP service stopped: {e}"))
    }

    fn tools() -> Vec<Tool> {
        let schema = |v: Value| match v {
            Value::Object(map) => Arc::new(map),
            _ => Arc::new(JsonObject::new()),
        };
        vec![
            Tool::new(
                "session_search",
                "Full-text search over the conversations Talaria has had (its terminal chats and every chat platform); returns the best-matching sessions with an excerpt each.",
                schema(json!({
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "words to look for"},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 20, "description": "most sessions to return (default 5)"}
                    },
                    "required": ["query"]
                })),
            ),
            Tool::new(
                "send_message",
                "Send a message through Talaria to a chat (a platform's home channel or a given chat), or list where it can send.",
                schema(json!({
                    "type": "object",
                    "properties": {
                        "action": {"type": "string", "enum": ["send", "list"], "description": "send (default) or list the targets"},
                        "target": {"type": "string", "description": "<platform> (its home channel), <platform>:<chat_id>[:<thread_id>] or local"},
                        "message": {"type": "string", "description": "the text to send"}
                    }
                })),
            ),
        ]
    }

    /// `session_search`. A wrong argument is an error result (`isError`),
    /// not a protocol error: the MCP specification has a model see input
    /// mistakes so it can correct itself, and keeps JSON-RPC errors for
    /// calls that are malformed as requests (an unknown tool).
    async fn search(&self, args: &JsonObject) -> CallToolResult {
        let Some(query) = args
            .get("query")
            .and_then(Value::as_str)
            .filter(|q| !q.trim().is_empty())
        else {
            return refused("`query` is required: the words to look for (a non-empty string)");
        };
        let limit = match args.get("limit") {
            None | Some(Value::Null) => 5,
            Some(v) => match v.as_u64() {
                Some(n) => n.clamp(1, MAX_RESULTS) as usize,
                None => {
                    return refused(&format!(
                        "`limit` must be a whole number from 1 to {MAX_RESULTS}"
                    ));
                }
            },
        };
        let hits = match self
            .store
            .search(SearchQuery {
                text: query.to_owned(),
                sources: Vec::new(),
                exclude_session: None,
                limit,
            })
            .await
        {
            Ok(hits) => hits,
            Err(e) => return refused(&format!("the search failed: {e}")),
        };
        let results: Vec<Value> = hits
            .iter()
            .map(|h| {
                json!({
                    "session_id": h.session.id,
                    "source": h.session.source,
                    "title": h.session.title,
                    "started_at": h.session.started_at,
                    "role": format!("{:?}", h.role).to_lowercase(),
                    "snippet": h.snippet,
                })
            })
            .collect();
        CallToolResult::success(vec![ContentBlock::text(
            json!({"query": query, "count": results.len(), "results": results}).to_string(),
        )])
    }

    /// `send_message`. Targets are listed and accepted by the same rule:
    /// what the messenger can reach, less `origin` (see [`names_origin`]).
    async fn send(&self, args: &JsonObject) -> CallToolResult {
        let action = match args.get("action") {
            None | Some(Value::Null) => "send",
            Some(v) => v.as_str().unwrap_or_default(),
        };
        if action == "list" {
            let targets = match self.messenger.targets().await {
                Ok(targets) => targets,
                Err(e) => return refused(&format!("the targets cannot be listed: {e}")),
            };
            let listed: Vec<Value> = targets
                .iter()
                .filter(|t| !names_origin(&t.target))
                .map(|t| json!({"target": t.target, "description": t.description}))
                .collect();
            return CallToolResult::success(vec![ContentBlock::text(
                json!({"targets": listed}).to_string(),
            )]);
        }
        if action != "send" {
            return refused(&format!("unknown action `{action}`: use send or list"));
        }
        let target = args.get("target").and_then(Value::as_str);
        let message = args.get("message").and_then(Value::as_str);
        let (Some(target), Some(message)) = (target, message) else {
            return refused(
                "`send` needs `target` and `message` (strings); action `list` shows the targets",
            );
        };
        if names_origin(target) {
            return refused(
                "`origin` is the chat a conversation takes place in, and a caller over MCP has none: \
                 name a platform (its home channel), <platform>:<chat_id> or local; action `list` shows them",
            );
        }
        match self.messenger.send(target, message, "").await {
            Ok(detail) => CallToolResult::success(vec![ContentBlock::text(detail)]),
            Err(e) => refused(&e),
        }
    }
}

/// Whether `target` is `origin`, the chat the calling conversation is in.
/// An MCP client is outside every conversation of Talaria's, so `origin`
/// has nothing to point at here: it is neither offered nor accepted (the
/// messenger would quietly take it for `local`).
fn names_origin(target: &str) -> bool {
    target.trim().eq_ignore_ascii_case("origin")
}

/// A call that ran and failed, as the client's model should see it.
fn refused(why: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(why.to_owned())])
}

impl ServerHandler for TalariaServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("talaria", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(TalariaServer::tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let result = match request.name.as_ref() {
            "session_search" => self.search(&args).await,
            "send_message" => self.send(&args).await,
            other => {
                return Err(ErrorData::invalid_params(
                    format!("no tool named `{other}`"),
                    None,
                ));
            }
        };
        Ok(result.into())
    }
}
