//! What the learning tests share: a home in a temporary folder and an
//! agent over the mock LLM with a real SQLite store.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, AgentParts};
use talaria_core::{Config, Endpoint, Home, ProviderKind, Redactor};
use talaria_store::SqliteStore;
use talaria_testkit::MockOpenAi;

/// A fresh home (created) in a temporary folder that lives as long as the
/// returned guard.
pub fn home() -> (tempfile::TempDir, Home) {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    home.ensure().unwrap();
    (dir, home)
}

/// A configuration pointing at `llm`, with no retries (failures show at
/// once), changed by `configure`.
pub fn config(llm: &MockOpenAi, configure: impl FnOnce(&mut Config)) -> Arc<Config> {
    let mut config = Config::default();
    config.model.default = Some("test-model".into());
    config.model.base_url = Some(llm.base_url());
    config.agent.api_max_retries = 0;
    configure(&mut config);
    Arc::new(config)
}

/// The provider for `llm`.
pub fn provider(llm: &MockOpenAi, config: &Config) -> Arc<dyn talaria_llm::Provider> {
    let endpoint = Endpoint {
        provider: ProviderKind::Custom,
        model: "test-model".into(),
        base_url: llm.base_url(),
        api_key: None,
    };
    talaria_llm::provider_for(&endpoint, &config.agent)
}

/// An agent over `home`'s database with `registry`'s tools.
pub fn agent(
    config: &Arc<Config>,
    home: &Home,
    llm: &MockOpenAi,
    store: Arc<SqliteStore>,
    registry: Registry,
    workdir: &Path,
) -> Agent {
    Agent::new(AgentParts {
        config: config.clone(),
        home: home.clone(),
        provider: provider(llm, config),
        store,
        registry: Arc::new(registry),
        interaction: Arc::new(NoHuman),
        redactor: Redactor::default(),
        workdir: workdir.to_path_buf(),
    })
}

/// The store of `home`.
pub fn store(home: &Home) -> Arc<SqliteStore> {
    Arc::new(SqliteStore::open(&home.state_db()).unwrap())
}
