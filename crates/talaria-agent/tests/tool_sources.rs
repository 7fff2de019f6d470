//! Tools from sources (MCP servers) join the registry per turn: built-ins
//! win a name clash, withheld names stay withheld, and reloads report per
//! source.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use serde_json::json;
use talaria_agent::tools::{Registry, Tool, ToolContext, ToolResult, ToolSource};

struct Named(&'static str, &'static str);

#[async_trait]
impl Tool for Named {
    fn name(&self) -> &str {
        self.0
    }
    fn description(&self) -> &str {
        self.1
    }
    fn parameters(&self) -> serde_json::Value {
        json!({"type": "object", "properties": {}})
    }
    async fn call(&self, _args: serde_json::Value, _ctx: &ToolContext) -> ToolResult {
        Ok(self.1.to_owned())
    }
}

/// Offers a fixed set of tools and counts how often it was asked.
struct Source {
    tools: Vec<(&'static str, &'static str)>,
    asked: AtomicUsize,
}

#[async_trait]
impl ToolSource for Source {
    fn name(&self) -> &str {
        "test-source"
    }
    async fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        self.tools
            .iter()
            .map(|(n, d)| Arc::new(Named(n, d)) as Arc<dyn Tool>)
            .collect()
    }
}

#[tokio::test]
async fn built_ins_win_clashes_and_withheld_names_stay_out() {
    let mut registry = Registry::new();
    registry
        .register(Arc::new(Named("memory", "built-in memory")))
        .unwrap();
    registry
        .register(Arc::new(Named("terminal", "built-in terminal")))
        .unwrap();
    let source = Arc::new(Source {
        tools: vec![
            ("terminal", "an impostor"),
            ("mcp_x_search", "from the source"),
            ("cronjob", "scheduled"),
        ],
        asked: AtomicUsize::new(0),
    });
    registry.add_source(source.clone());
    // The static view does not ask the source.
    assert_eq!(registry.names(), ["memory", "terminal"]);
    assert_eq!(source.asked.load(Ordering::SeqCst), 0);

    let turn = registry.for_turn().await;
    assert_eq!(
        turn.names(),
        ["cronjob", "mcp_x_search", "memory", "terminal"]
    );
    assert_eq!(
        turn.get("terminal").unwrap().description(),
        "built-in terminal"
    );
    assert!(!turn.has_sources());
    // Twice asked, the clash is still resolved the same way.
    let again = registry.for_turn().await;
    assert_eq!(
        again.get("terminal").unwrap().description(),
        "built-in terminal"
    );
    assert_eq!(source.asked.load(Ordering::SeqCst), 2);

    // A registry without `cronjob` keeps it out even when a source offers it.
    let cron = registry.without(&["memory", "cronjob"]).for_turn().await;
    assert_eq!(cron.names(), ["mcp_x_search", "terminal"]);

    // Sources without a configuration to reload say so.
    assert_eq!(
        registry.reload_sources().await,
        "test-source has nothing to reload"
    );
    assert!(
        Registry::new()
            .reload_sources()
            .await
            .contains("No MCP servers")
    );
}
