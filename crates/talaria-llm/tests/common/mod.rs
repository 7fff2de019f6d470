//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use talaria_core::{Endpoint, Message, ProviderKind, Secret};
use talaria_llm::{ChatRequest, HttpOptions, StreamEvent, ToolSpec};

pub fn endpoint(kind: ProviderKind, model: &str, base_url: String, key: Option<&str>) -> Endpoint {
    Endpoint {
        provider: kind,
        model: model.to_owned(),
        base_url,
        api_key: key.map(Secret::new),
    }
}

/// Options with timeouts short enough for tests but far above normal latency.
pub fn opts(stream: bool) -> HttpOptions {
    HttpOptions {
        connect_timeout: Duration::from_secs(5),
        stale_timeout: Duration::from_secs(30),
        request_timeout: Duration::from_secs(30),
        stream,
        ..HttpOptions::default()
    }
}

pub fn request() -> ChatRequest {
    ChatRequest {
        messages: vec![Message::system("You are terse."), Message::user("hi")],
        ..ChatRequest::default()
    }
}

pub fn tool_request() -> ChatRequest {
    ChatRequest {
        tools: vec![ToolSpec {
            name: "terminal".into(),
            description: "Run a shell command".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"command": {"type": "string"}}}),
        }],
        ..request()
    }
}

/// Collects stream events.
#[derive(Clone, Default)]
pub struct Events(pub Arc<Mutex<Vec<StreamEvent>>>);

impl Events {
    pub fn push(&self, e: StreamEvent) {
        self.0.lock().unwrap().push(e);
    }

    pub fn all(&self) -> Vec<StreamEvent> {
        self.0.lock().unwrap().clone()
    }

    pub fn text(&self) -> String {
        self.all()
            .into_iter()
            .filter_map(|e| match e {
                StreamEvent::Text(t) => Some(t),
                _ => None,
            })
            .collect()
    }

    pub fn count_text(&self) -> usize {
        self.all()
            .iter()
            .filter(|e| matches!(e, StreamEvent::Text(_)))
            .count()
    }
}
