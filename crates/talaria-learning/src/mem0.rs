//! A memory provider for mem0-compatible services (the mem0 platform's
//! REST API, or a server speaking it): memories relevant to each message
//! are searched before the turn, and each finished exchange is added after
//! it.
//!
//! - search: `POST {base}/v1/memories/search/` with `{query, user_id,
//!   limit}`, answered with a list of `{memory, score, ...}` (or an object
//!   holding it under `results`);
//! - add: `POST {base}/v1/memories/` with `{messages: [{role, content}],
//!   user_id}`;
//! - the key goes in `Authorization: Token <key>`.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_agent::memory_provider::MemoryProvider;
use talaria_core::Env;
use talaria_core::config::Mem0Config;

/// The longest wait for one request; recall has its own, shorter bound.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// The longest recalled text, in chars.
const MAX_RECALL_CHARS: usize = 4_000;

/// A mem0-compatible service.
pub struct Mem0 {
    client: reqwest::Client,
    base: String,
    user_id: String,
    key: Option<String>,
    limit: u32,
}

impl Mem0 {
    /// From `memory.mem0`, the key from there or `MEM0_API_KEY`.
    pub fn from_config(config: &Mem0Config, env: &Env) -> Result<Mem0, String> {
        let client = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        let key = config
            .api_key
            .as_ref()
            .map(|k| k.expose().to_owned())
            .or_else(|| env.get("MEM0_API_KEY").map(str::to_owned))
            .filter(|k| !k.trim().is_empty());
        Ok(Mem0 {
            client,
            base: config.base_url.trim_end_matches('/').to_owned(),
            user_id: config.user_id.clone(),
            key,
            limit: config.limit.max(1),
        })
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value, String> {
        let mut request = self.client.post(format!("{}{path}", self.base)).json(&body);
        if let Some(key) = &self.key {
            request = request.header("Authorization", format!("Token {key}"));
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("mem0 is unreachable: {}", e.without_url()))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("mem0 answered HTTP {}", status.as_u16()));
        }
        response
            .json()
            .await
            .map_err(|e| format!("mem0 sent a body that is not JSON: {}", e.without_url()))
    }
}

#[async_trait]
impl MemoryProvider for Mem0 {
    fn name(&self) -> &str {
        "mem0"
    }

    async fn prefetch(&self, query: &str, _session_id: &str) -> Result<Option<String>, String> {
        if query.trim().is_empty() {
            return Ok(None);
        }
        let found = self
            .post(
                "/v1/memories/search/",
                json!({"query": query, "user_id": self.user_id, "limit": self.limit}),
            )
            .await?;
        let items = match &found {
            Value::Array(items) => items.as_slice(),
            Value::Object(map) => map
                .get("results")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default(),
            _ => return Err("mem0's search answer has no results".into()),
        };
        let lines: Vec<String> = items
            .iter()
            .filter_map(|m| m["memory"].as_str())
            .filter(|m| !m.trim().is_empty())
            .map(|m| format!("- {}", m.trim()))
            .collect();
        if lines.is_empty() {
            return Ok(None);
        }
        let text: String = lines.join("\n").chars().take(MAX_RECALL_CHARS).collect();
        Ok(Some(text))
    }

    async fn sync_turn(
        &self,
        user: &str,
        assistant: &str,
        _session_id: &str,
    ) -> Result<(), String> {
        self.post(
            "/v1/memories/",
            json!({
                "messages": [
                    {"role": "user", "content": user},
                    {"role": "assistant", "content": assistant},
                ],
                "user_id": self.user_id,
            }),
        )
        .await
        .map(drop)
    }
}
