//! The configuration as it takes effect: `config.yaml` with the values
//! that come from the environment (the process or `$TALARIA_HOME/.env`)
//! filled in where they apply, each marked with where it came from. This
//! is what `talaria config show` prints, so that a token set in `.env`
//! shows as set (masked), not as `null`.

use serde_json::Value;

use crate::config::{Config, Env, mask};

/// A configuration key that an environment variable fills or overrides.
struct EnvKey {
    /// The key's path in `config.yaml`, dot-separated.
    key: &'static str,
    var: &'static str,
    /// The variable wins over the file (`TALARIA_MODEL`); otherwise it
    /// fills the key only when the file leaves it empty.
    overrides: bool,
}

const fn fills(key: &'static str, var: &'static str) -> EnvKey {
    EnvKey {
        key,
        var,
        overrides: false,
    }
}

/// Every configuration key a variable of a fixed name supplies, as the
/// model client and the platform adapters read them. The model's key
/// variable depends on the provider and is handled apart.
const ENV_KEYS: &[EnvKey] = &[
    EnvKey {
        key: "model.default",
        var: "TALARIA_MODEL",
        overrides: true,
    },
    EnvKey {
        key: "model.base_url",
        var: "TALARIA_BASE_URL",
        overrides: true,
    },
    fills("platforms.telegram.token", "TELEGRAM_BOT_TOKEN"),
    fills("platforms.discord.token", "DISCORD_BOT_TOKEN"),
    fills("platforms.slack.bot_token", "SLACK_BOT_TOKEN"),
    fills("platforms.slack.app_token", "SLACK_APP_TOKEN"),
    fills("platforms.mattermost.token", "MATTERMOST_TOKEN"),
    fills("platforms.mattermost.url", "MATTERMOST_URL"),
    fills("platforms.matrix.homeserver", "MATRIX_HOMESERVER"),
    fills("platforms.matrix.access_token", "MATRIX_ACCESS_TOKEN"),
    fills("platforms.matrix.user_id", "MATRIX_USER_ID"),
    fills("platforms.signal.http_url", "SIGNAL_HTTP_URL"),
    fills("platforms.signal.account", "SIGNAL_ACCOUNT"),
    fills("platforms.whatsapp_cloud.token", "WHATSAPP_CLOUD_TOKEN"),
    fills(
        "platforms.whatsapp_cloud.phone_number_id",
        "WHATSAPP_CLOUD_PHONE_NUMBER_ID",
    ),
    fills(
        "platforms.whatsapp_cloud.app_secret",
        "WHATSAPP_CLOUD_APP_SECRET",
    ),
    fills(
        "platforms.whatsapp_cloud.verify_token",
        "WHATSAPP_CLOUD_VERIFY_TOKEN",
    ),
    fills("platforms.sms.account_sid", "TWILIO_ACCOUNT_SID"),
    fills("platforms.sms.auth_token", "TWILIO_AUTH_TOKEN"),
    fills("platforms.sms.phone_number", "TWILIO_PHONE_NUMBER"),
    fills("platforms.sms.webhook_url", "SMS_WEBHOOK_URL"),
    fills("platforms.email.address", "EMAIL_ADDRESS"),
    fills("platforms.email.password", "EMAIL_PASSWORD"),
    fills("platforms.email.imap_host", "EMAIL_IMAP_HOST"),
    fills("platforms.email.smtp_host", "EMAIL_SMTP_HOST"),
    fills("platforms.homeassistant.url", "HASS_URL"),
    fills("platforms.homeassistant.token", "HASS_TOKEN"),
    fills(
        "platforms.homeassistant.conversation_token",
        "HASS_CONVERSATION_TOKEN",
    ),
    fills("platforms.api_server.key", "API_SERVER_KEY"),
    fills("platforms.api_server.host", "API_SERVER_HOST"),
    fills("platforms.api_server.port", "API_SERVER_PORT"),
];

/// A value the environment supplied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FromEnv {
    /// The key's path in `config.yaml`.
    pub key: String,
    /// The environment variable that supplied it.
    pub var: String,
    /// `.env` or `the environment` (the process's).
    pub origin: &'static str,
    /// The value as shown: masked when it is a credential.
    pub shown: String,
    /// It replaced a value the file set.
    pub overrode: bool,
}

/// The configuration as a tree (secrets masked), with the environment's
/// values in place, and the list of those values.
pub fn effective(config: &Config, env: &Env) -> (Value, Vec<FromEnv>) {
    let mut tree = serde_json::to_value(config).unwrap_or(Value::Null);
    let mut supplied = Vec::new();
    let api_key_var = config.model.provider.api_key_env();
    let model_key = EnvKey {
        key: "model.api_key",
        var: api_key_var,
        overrides: false,
    };
    for entry in ENV_KEYS.iter().chain(std::iter::once(&model_key)) {
        let Some(value) = env.get(entry.var) else {
            continue;
        };
        let Some(slot) = slot(&mut tree, entry.key) else {
            continue;
        };
        let set_in_file = !slot.is_null();
        if set_in_file && !entry.overrides {
            continue;
        }
        let shown = if is_credential(entry.key) {
            mask(value)
        } else {
            value.trim().to_owned()
        };
        *slot = match shown.parse::<u16>() {
            Ok(port) if entry.key.ends_with(".port") => Value::from(port),
            _ => Value::String(shown.clone()),
        };
        supplied.push(FromEnv {
            key: entry.key.to_owned(),
            var: entry.var.to_owned(),
            origin: env.origin(entry.var),
            shown,
            overrode: set_in_file,
        });
    }
    (tree, supplied)
}

/// The leaf at a dotted path, if the tree has that key.
fn slot<'t>(tree: &'t mut Value, path: &str) -> Option<&'t mut Value> {
    let mut at = tree;
    for part in path.split('.') {
        at = at.as_object_mut()?.get_mut(part)?;
    }
    Some(at)
}

fn is_credential(key: &str) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key);
    ["token", "key", "secret", "password", "sid"]
        .iter()
        .any(|word| last.contains(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_key_exists_in_the_configuration() {
        // A key renamed in the schema but not here would silently show
        // nothing: every path must resolve in the default configuration.
        let mut tree = serde_json::to_value(Config::default()).unwrap();
        for entry in ENV_KEYS {
            assert!(slot(&mut tree, entry.key).is_some(), "{}", entry.key);
        }
    }

    #[test]
    fn the_environment_fills_empty_keys_masked_and_overrides_the_model() {
        let mut config = Config::default();
        config.model.default = Some("from-file".into());
        config.platforms.discord.token = Some(crate::Secret::new("file-token-0123456789"));
        let env = Env::from_pairs([
            ("TELEGRAM_BOT_TOKEN", "123456:ABCDEFGHIJKLMNOP"),
            ("DISCORD_BOT_TOKEN", "env-token-should-not-win"),
            ("TALARIA_MODEL", "from-env"),
            ("MATTERMOST_URL", "https://chat.example.org"),
        ]);
        let (tree, supplied) = effective(&config, &env);
        assert_eq!(tree["platforms"]["telegram"]["token"], "****MNOP");
        assert_eq!(tree["platforms"]["discord"]["token"], "****6789");
        assert_eq!(tree["model"]["default"], "from-env");
        assert_eq!(
            tree["platforms"]["mattermost"]["url"],
            "https://chat.example.org"
        );
        let keys: Vec<(&str, bool)> = supplied
            .iter()
            .map(|s| (s.key.as_str(), s.overrode))
            .collect();
        assert_eq!(
            keys,
            [
                ("model.default", true),
                ("platforms.telegram.token", false),
                ("platforms.mattermost.url", false),
            ]
        );
        assert!(!format!("{tree}{supplied:?}").contains("ABCDEFGH"));
    }
}
