//! Naming a model other than the configured default: `/model` in a
//! conversation, `talaria model`, and `model.routes` (names an API client
//! may ask for).

use super::*;

/// A model to use instead of `model.default`, and where it is served. A
/// route with no provider is the primary's server asked for another
/// model; one with a provider is that provider's server (its default URL
/// and key variable unless given here).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRoute {
    /// The model name sent to the server.
    pub model: String,
    /// Which kind of server; the primary's when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderKind>,
    /// The server's root URL; the provider's default (or, without a
    /// provider, the primary's URL) when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The key; else the provider's variable (or the primary's key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<Secret>,
}

impl ModelRoute {
    /// Reads what a person types after `/model`: `name`, or
    /// `provider:name` when the part before the first colon names a
    /// provider. Model names may hold colons themselves (Ollama's
    /// `llama3.1:8b`), so an unknown prefix is part of the name.
    pub fn parse(spec: &str) -> Result<ModelRoute, String> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err("no model named".to_owned());
        }
        if spec.chars().any(char::is_whitespace) {
            return Err(format!("`{spec}` is not a model name: it holds spaces"));
        }
        let (provider, model) = match spec.split_once(':') {
            Some((prefix, rest)) => match provider_named(prefix) {
                Some(kind) => (Some(kind), rest),
                None => (None, spec),
            },
            None => (None, spec),
        };
        if model.is_empty() {
            return Err(format!("`{spec}` names a provider but no model"));
        }
        Ok(ModelRoute {
            model: model.to_owned(),
            provider,
            base_url: None,
            api_key: None,
        })
    }

    /// How [`ModelRoute::parse`] reads it back: `provider:model`, or the
    /// model alone for the primary's server.
    pub fn spec(&self) -> String {
        match self.provider {
            Some(kind) => format!("{}:{}", kind.as_str(), self.model),
            None => self.model.clone(),
        }
    }
}

/// The provider spelled `name` in `config.yaml`, if any.
fn provider_named(name: &str) -> Option<ProviderKind> {
    // Serde knows every spelling `config.yaml` accepts, so this list
    // cannot fall behind the enum.
    serde_json::from_value(serde_json::Value::String(name.to_ascii_lowercase())).ok()
}

impl Config {
    /// The route `model.routes` gives `name`, if any.
    pub fn route(&self, name: &str) -> Option<&ModelRoute> {
        self.model.routes.get(name)
    }

    /// The endpoint serving `route`: the primary's server and key asked
    /// for another model when the route names no other provider, else that
    /// provider's, as a fallback's are found. The error says what is
    /// missing.
    pub fn route_endpoint(&self, route: &ModelRoute, env: &Env) -> Result<Endpoint, String> {
        let primary = self.primary_endpoint(env);
        let same_server = match (route.provider, &primary) {
            (None, _) => true,
            (Some(kind), Ok(p)) => kind == p.provider && route.base_url.is_none(),
            (Some(_), Err(_)) => false,
        };
        if same_server {
            let primary = primary?;
            return Ok(Endpoint {
                model: route.model.clone(),
                base_url: route.base_url.clone().unwrap_or(primary.base_url),
                api_key: route.api_key.clone().or(primary.api_key),
                ..primary
            });
        }
        let provider = route.provider.unwrap_or(self.model.provider);
        let base_url = route
            .base_url
            .clone()
            .or_else(|| provider.default_base_url().map(str::to_owned))
            .ok_or_else(|| {
                format!(
                    "`{}` needs a base_url: provider `{}` has no default address",
                    route.spec(),
                    provider.as_str()
                )
            })?;
        let api_key = route
            .api_key
            .clone()
            .or_else(|| env.get(provider.api_key_env()).map(Secret::new));
        if api_key.is_none() && provider != ProviderKind::Custom {
            return Err(format!(
                "provider `{}` needs an API key: set {}",
                provider.as_str(),
                provider.api_key_env()
            ));
        }
        Ok(Endpoint {
            provider,
            model: route.model.clone(),
            base_url,
            api_key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_names_a_provider_only_when_its_prefix_is_one() {
        let r = ModelRoute::parse("openrouter:anthropic/claude-sonnet-4").unwrap();
        assert_eq!(r.provider, Some(ProviderKind::Openrouter));
        assert_eq!(r.model, "anthropic/claude-sonnet-4");
        let r = ModelRoute::parse("llama3.1:8b").unwrap();
        assert_eq!((r.provider, r.model.as_str()), (None, "llama3.1:8b"));
        let r = ModelRoute::parse("Anthropic:claude-haiku-4-5").unwrap();
        assert_eq!(r.spec(), "anthropic:claude-haiku-4-5");
        assert!(ModelRoute::parse("openai:").is_err());
        assert!(ModelRoute::parse("  ").is_err());
        assert!(ModelRoute::parse("gpt 4").is_err());
    }

    fn config(yaml: &str) -> Config {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn a_route_without_a_provider_keeps_the_primary_server_and_key() {
        let c = config(
            "model: {default: big, base_url: 'http://127.0.0.1:9/v1', api_key: k1}\n\
             ",
        );
        let env = Env::default();
        let e = c
            .route_endpoint(&ModelRoute::parse("small").unwrap(), &env)
            .unwrap();
        assert_eq!(e.model, "small");
        assert_eq!(e.base_url, "http://127.0.0.1:9/v1");
        assert_eq!(e.api_key.as_ref().map(Secret::expose), Some("k1"));
    }

    #[test]
    fn a_route_to_another_provider_uses_its_address_and_variable() {
        let c = config("model: {default: big, base_url: 'http://127.0.0.1:9/v1'}\n");
        let missing = c
            .route_endpoint(
                &ModelRoute::parse("openai:gpt-4o").unwrap(),
                &Env::default(),
            )
            .unwrap_err();
        assert!(missing.contains("OPENAI_API_KEY"), "{missing}");
        let env = Env::from_pairs([("OPENAI_API_KEY", "sk-x")]);
        let e = c
            .route_endpoint(&ModelRoute::parse("openai:gpt-4o").unwrap(), &env)
            .unwrap();
        assert_eq!(e.provider, ProviderKind::Openai);
        assert_eq!(e.base_url, "https://api.openai.com/v1");
    }

    #[test]
    fn routes_are_read_from_the_model_section() {
        let c = config(
            "model:\n  default: big\n  base_url: 'http://127.0.0.1:9/v1'\n  routes:\n    fast: {model: small}\n    claude: {model: claude-haiku-4-5, provider: anthropic}\n",
        );
        assert_eq!(c.route("fast").map(|r| r.model.as_str()), Some("small"));
        assert_eq!(
            c.route("claude").and_then(|r| r.provider),
            Some(ProviderKind::Anthropic)
        );
        assert!(c.route("slow").is_none());
    }
}
