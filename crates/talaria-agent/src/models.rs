//! [`ModelSwitch`]: the providers of models other than the configured
//! default, for a conversation that switched (`/model`) and for an API
//! client that asked for a route by name (`model.routes`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use talaria_core::{Config, Env, ModelRoute};
use talaria_llm::LlmClient;
/// What serves a model's requests, for front ends that pick one per turn
/// ([`crate::TurnOptions::provider`]).
pub use talaria_llm::Provider;

/// At most this many switched-to providers are kept built; past it the
/// cache starts over. People switch among a handful of models, but the
/// names are typed by chats, so the cache must not grow with them.
const MAX_CACHED: usize = 32;

/// Builds (once) and hands out the provider serving a [`ModelRoute`]:
/// that model on its server, with the configured retries, timeouts and
/// fallbacks.
pub struct ModelSwitch {
    config: Arc<Config>,
    env: Env,
    built: Mutex<HashMap<String, Arc<dyn Provider>>>,
}

impl std::fmt::Debug for ModelSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The environment holds keys: never printed.
        f.debug_struct("ModelSwitch").finish_non_exhaustive()
    }
}

impl ModelSwitch {
    /// Switching within `config`, with keys from `env`.
    pub fn new(config: Arc<Config>, env: Env) -> ModelSwitch {
        ModelSwitch {
            config,
            env,
            built: Mutex::new(HashMap::new()),
        }
    }

    /// The configuration routes come from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What `name` means: a `model.routes` name first, else a model name
    /// as [`ModelRoute::parse`] reads it.
    pub fn resolve(&self, name: &str) -> Result<ModelRoute, String> {
        match self.config.route(name.trim()) {
            Some(route) => Ok(route.clone()),
            None => ModelRoute::parse(name),
        }
    }

    /// The provider serving `route`; the error says what the route lacks
    /// (an address, a key).
    pub fn provider(&self, route: &ModelRoute) -> Result<Arc<dyn Provider>, String> {
        let endpoint = self.config.route_endpoint(route, &self.env)?;
        let key = format!(
            "{}\u{1f}{}\u{1f}{}",
            endpoint.provider.as_str(),
            endpoint.base_url,
            endpoint.model
        );
        let mut built = self.built.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(provider) = built.get(&key) {
            return Ok(provider.clone());
        }
        if built.len() >= MAX_CACHED {
            built.clear();
        }
        let provider: Arc<dyn Provider> =
            Arc::new(LlmClient::serving(&self.config, &self.env, &endpoint));
        built.insert(key, provider.clone());
        Ok(provider)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switch() -> ModelSwitch {
        let mut config = Config::default();
        config.model.default = Some("big".to_owned());
        config.model.base_url = Some("http://127.0.0.1:9/v1".to_owned());
        config
            .model
            .routes
            .insert("fast".to_owned(), ModelRoute::parse("small").unwrap());
        ModelSwitch::new(Arc::new(config), Env::default())
    }

    #[test]
    fn a_route_name_wins_over_a_model_name() {
        let s = switch();
        assert_eq!(s.resolve("fast").unwrap().model, "small");
        assert_eq!(s.resolve("medium").unwrap().model, "medium");
    }

    #[test]
    fn a_provider_is_built_once_per_model_and_server() {
        let s = switch();
        let a = s.provider(&s.resolve("fast").unwrap()).unwrap();
        let b = s.provider(&ModelRoute::parse("small").unwrap()).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.model(), "small");
        let missing = s.provider(&ModelRoute::parse("anthropic:claude").unwrap());
        match missing {
            Err(e) => assert!(e.contains("ANTHROPIC_API_KEY"), "{e}"),
            Ok(_) => panic!("a provider without its key was built"),
        }
    }
}
