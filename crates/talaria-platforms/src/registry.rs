//! Every platform this build knows, one entry each: its name, its
//! configuration section (read and checked by the platform's own type) and
//! its constructor. Whatever walks the platforms (`talaria gateway run`,
//! `talaria send`, `talaria config check` and `config show`, the docs'
//! table) walks [`PLATFORMS`], so adding a platform is its folder and one
//! line here.

use std::error::Error;
use std::sync::Arc;

use talaria_adapter::{Adapter, Capabilities};
use talaria_core::config::secret_or_env;
use talaria_core::config::{Checked, ConfigError, Origin, PlatformSection};
use talaria_core::effective::EnvKey;
use talaria_core::{Config, Env, Secret};
use talaria_store::CursorStore;

#[cfg(feature = "ingress")]
use crate::ingress::Mount;

/// What a constructor may use: the configuration as loaded, the
/// environment, and the store for a platform's sync position.
pub struct Setup<'a> {
    /// The home, for an adapter that keeps files of its own there
    /// (Matrix's encryption keys).
    pub home: &'a talaria_core::Home,
    /// The whole configuration; a platform reads its own section.
    pub config: &'a Config,
    /// `.env` overlaid by the process environment.
    pub env: &'a Env,
    /// Where an adapter keeps its position across restarts.
    pub cursors: Arc<dyn CursorStore>,
    /// The media cache, for an adapter that receives files' bytes inline
    /// (an e-mail's parts) and stores them at intake.
    pub media: talaria_media::MediaCache,
    /// Yuanbao's socket request channel, shared with the `yb_*` tools of
    /// the same process.
    #[cfg(feature = "yuanbao")]
    pub yuanbao: crate::yuanbao::YuanbaoLink,
}

impl Setup<'_> {
    /// The platform's section of the configuration, read into its type.
    /// The section was checked when the configuration was loaded, with
    /// messages that name lines; a failure here is still reported, as a
    /// misconfiguration.
    pub fn section<T: PlatformSection>(&self) -> Result<T, BuildError> {
        T::read(self.config).map_err(BuildError::misconfigured)
    }
}

/// A platform that is configured, set up but not connected.
pub struct Built {
    /// The adapter the gateway runs and sends through.
    pub adapter: Arc<dyn Adapter>,
    /// Its routes on the shared webhook listener, when it receives by
    /// webhook.
    #[cfg(feature = "ingress")]
    pub mount: Option<Mount>,
}

/// Why a configured platform could not be set up.
#[derive(Debug)]
pub enum BuildError {
    /// Its settings are incomplete or contradict each other.
    Misconfigured(Box<dyn Error + Send + Sync>),
    /// Its settings were read, but the adapter refused them.
    SetUp(Box<dyn Error + Send + Sync>),
}

/// One platform.
pub struct Platform {
    /// Its name: what its adapter reports, its section's key under
    /// `platforms:` and the prefix of its environment variables.
    pub name: &'static str,
    /// Its name for people (`WhatsApp Cloud`, `SMS (Twilio)`).
    pub title: &'static str,
    /// Whether it is a chat `talaria send` can deliver through without a
    /// running gateway (a webhook route only answers its own deliveries).
    pub standalone: bool,
    /// What it can do, as its adapter declares it: known without building
    /// one, so the CLI can ask (who may be offered a pairing code).
    pub capabilities: Capabilities,
    /// Reads and checks its section (`platforms.<name>`), enabled or not:
    /// an error or unknown key there is reported by `talaria config check`
    /// and stops any command that loads the configuration.
    /// [`talaria_core::config::check_section`] for the section's type.
    pub check: fn(&Config, &Origin<'_>) -> Result<Checked, ConfigError>,
    /// The keys of its section that environment variables fill, for
    /// `talaria config show`'s "from the environment" markers.
    pub env: &'static [EnvKey],
    /// Builds its adapter when its settings (section and environment)
    /// turn it on; `Ok(None)` when they leave it off.
    pub build: fn(&Setup<'_>) -> Result<Option<Built>, BuildError>,
}

impl Built {
    /// An adapter that receives over a connection of its own.
    pub fn connected(adapter: impl Adapter + 'static) -> Built {
        Built {
            adapter: Arc::new(adapter),
            #[cfg(feature = "ingress")]
            mount: None,
        }
    }
}

impl BuildError {
    /// A misconfiguration, from any error.
    pub fn misconfigured(e: impl Error + Send + Sync + 'static) -> BuildError {
        BuildError::Misconfigured(Box::new(e))
    }

    /// A refused set-up, from any error.
    pub fn set_up(e: impl Error + Send + Sync + 'static) -> BuildError {
        BuildError::SetUp(Box::new(e))
    }
}

/// The platforms compiled into this build, in the order they start.
pub const PLATFORMS: &[Platform] = &[
    #[cfg(feature = "telegram")]
    crate::telegram::ENTRY,
    #[cfg(feature = "discord")]
    crate::discord::ENTRY,
    #[cfg(feature = "mattermost")]
    crate::mattermost::ENTRY,
    #[cfg(feature = "matrix")]
    crate::matrix::ENTRY,
    #[cfg(feature = "slack")]
    crate::slack::ENTRY,
    #[cfg(feature = "signal")]
    crate::signal::ENTRY,
    #[cfg(feature = "whatsapp")]
    crate::whatsapp::ENTRY,
    #[cfg(feature = "feishu")]
    crate::feishu::ENTRY,
    #[cfg(feature = "sms")]
    crate::sms::ENTRY,
    #[cfg(feature = "email")]
    crate::email::ENTRY,
    #[cfg(feature = "homeassistant")]
    crate::homeassistant::ENTRY,
    #[cfg(feature = "webhook")]
    crate::webhook::ENTRY,
    #[cfg(feature = "dingtalk")]
    crate::dingtalk::ENTRY,
    #[cfg(feature = "qqbot")]
    crate::qqbot::ENTRY,
    #[cfg(feature = "weixin")]
    crate::weixin::ENTRY,
    #[cfg(feature = "yuanbao")]
    crate::yuanbao::ENTRY,
    #[cfg(feature = "wecom")]
    crate::wecom::callback::ENTRY,
    #[cfg(feature = "wecom")]
    crate::wecom::bot::ENTRY,
    #[cfg(feature = "irc")]
    crate::irc::ENTRY,
    #[cfg(feature = "line")]
    crate::line::ENTRY,
    #[cfg(feature = "bluebubbles")]
    crate::bluebubbles::ENTRY,
    #[cfg(feature = "google_chat")]
    crate::google_chat::ENTRY,
    #[cfg(feature = "msgraph")]
    crate::msgraph::ENTRY,
];

/// The token that turns a platform on, from its section or else `var`;
/// `None` when `enabled: false` says off or no token is set anywhere (then,
/// when `enabled: true` asked for the platform, a warning says where the
/// token goes). `key` is the token's key path, `platforms.<name>.token`.
pub fn token_switch(
    enabled: Option<bool>,
    configured: Option<&Secret>,
    env: &Env,
    key: &str,
    var: &str,
) -> Option<Secret> {
    if enabled == Some(false) {
        return None;
    }
    let token = secret_or_env(configured, env, var);
    if token.is_none() && enabled == Some(true) {
        let section = key.rsplit_once('.').map_or(key, |(section, _)| section);
        tracing::warn!("{section}.enabled is true but no token is set ({key} or {var})");
    }
    token
}

/// The entry named `name`.
pub fn platform(name: &str) -> Option<&'static Platform> {
    PLATFORMS.iter().find(|p| p.name == name)
}

/// Test helper: `text` read as `config.yaml`, then the section `T` read
/// from it as `talaria config check` reads it, with the configuration.
#[cfg(test)]
pub(crate) fn read_section<T: PlatformSection>(
    text: &str,
) -> Result<(T, Vec<String>, Config), ConfigError> {
    let path = std::path::Path::new("config.yaml");
    let (config, _) = Config::parse(text, path)?;
    let origin = Origin {
        path,
        text: Some(text),
    };
    let (section, warnings) = talaria_core::config::parse_section::<T>(&config, &origin)?;
    Ok((section, warnings, config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_turns_a_platform_on_unless_the_section_says_off() {
        let with = Env::from_pairs([("X_TOKEN", "from-env")]);
        let without = Env::from_pairs(Vec::<(String, String)>::new());
        let file = Secret::new("from-file");
        let on = |enabled, configured: Option<&Secret>, env: &Env| {
            token_switch(enabled, configured, env, "platforms.x.token", "X_TOKEN")
                .map(|t| t.expose().to_owned())
        };
        assert_eq!(on(None, None, &with).as_deref(), Some("from-env"));
        assert_eq!(on(None, Some(&file), &with).as_deref(), Some("from-file"));
        assert_eq!(on(Some(true), None, &with).as_deref(), Some("from-env"));
        assert_eq!(on(Some(false), Some(&file), &with), None);
        assert_eq!(on(Some(true), None, &without), None);
        assert_eq!(on(None, None, &without), None);
    }

    #[test]
    fn names_are_unique_and_usable_as_keys() {
        let mut names: Vec<&str> = PLATFORMS.iter().map(|p| p.name).collect();
        names.sort_unstable();
        let count = names.len();
        names.dedup();
        assert_eq!(names.len(), count, "a platform is registered twice");
        for name in names {
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{name}"
            );
            assert_eq!(platform(name).map(|p| p.name), Some(name));
        }
    }

    fn origin(text: &str) -> Origin<'_> {
        Origin {
            path: std::path::Path::new("config.yaml"),
            text: Some(text),
        }
    }

    fn config(text: &str) -> Config {
        Config::parse(text, std::path::Path::new("config.yaml"))
            .unwrap()
            .0
    }

    #[test]
    fn every_section_reads_its_own_key_and_lists_keys_it_has() {
        for p in PLATFORMS {
            // Defaults pass their own checks.
            let checked = (p.check)(&Config::default(), &origin("")).unwrap();
            assert!(checked.warnings.is_empty(), "{}", p.name);
            // The section read is the entry's own: its unknown key is
            // named under `platforms.<name>`.
            let text = format!("platforms:\n  {}:\n    no_such_key: 1\n", p.name);
            let checked = (p.check)(&config(&text), &origin(&text)).unwrap();
            assert_eq!(
                checked.warnings,
                [format!(
                    "config.yaml: unknown key `platforms.{}.no_such_key` (ignored)",
                    p.name
                )]
            );
            // Every key an environment variable fills exists in the
            // section (was core's list of `platforms.*` keys).
            assert_eq!(
                talaria_core::effective::missing_env_key(&checked.shown, p.env),
                None,
                "{}",
                p.name
            );
        }
    }

    #[test]
    fn server_addresses_must_be_http_urls_and_errors_name_key_and_line() {
        // The checks core's `load.rs` made before the sections moved.
        for (section, key) in [
            ("telegram", "base_url"),
            ("matrix", "homeserver"),
            ("signal", "http_url"),
            ("slack", "api_base"),
            ("sms", "api_base"),
        ] {
            let Some(p) = platform(section) else {
                continue;
            };
            let text =
                format!("model:\n  default: m\nplatforms:\n  {section}:\n    {key}: ftp://x\n");
            match (p.check)(&config(&text), &origin(&text)) {
                Err(ConfigError::Invalid {
                    key: found,
                    line,
                    message,
                    ..
                }) => {
                    assert_eq!(found, format!("platforms.{section}.{key}"));
                    assert_eq!(line, Some(5), "{section}");
                    assert!(message.contains("http"), "{message}");
                }
                other => panic!("{section}: {other:?}"),
            }
            let text = format!("platforms:\n  {section}:\n    {key}: https://x.example\n");
            assert!(
                (p.check)(&config(&text), &origin(&text)).is_ok(),
                "{section}"
            );
        }
    }

    /// Plants a distinct value in every leaf of a section's tree whose
    /// name says credential (and a URL with credentials in every URL
    /// leaf), recording `(path, value, is_url)`; as core's test of the
    /// same name does for the rest of the file.
    fn plant(tree: &mut serde_json::Value, path: &str, planted: &mut Vec<(String, String, bool)>) {
        use serde_json::Value;
        match tree {
            Value::Object(map) => {
                for (k, v) in map.iter_mut() {
                    let here = format!("{path}.{k}");
                    let tag: String = here
                        .chars()
                        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                        .collect();
                    let leaf = v.is_null() || v.is_string();
                    let low = k.to_ascii_lowercase();
                    let credential = ["token", "key", "secret", "password"]
                        .iter()
                        .any(|w| low.contains(w));
                    if leaf && credential && !low.ends_with("_env") {
                        let value = format!("planted{tag}-0123456789");
                        *v = Value::String(value.clone());
                        planted.push((here, value, false));
                    } else if leaf
                        && (low.contains("url") || low.ends_with("base") || low == "homeserver")
                    {
                        // A socket's address must be ws:// or wss:// to pass
                        // its section's check.
                        let scheme = if low.contains("websocket") {
                            "wss"
                        } else {
                            "https"
                        };
                        let value = format!(
                            "{scheme}://bot:pw{tag}-0123456789@h.example/v1?api-key=qk{tag}-0123456789"
                        );
                        *v = Value::String(value.clone());
                        planted.push((here, value, true));
                    } else {
                        plant(v, &here, planted);
                    }
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    plant(item, &format!("{path}[{i}]"), planted);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn every_credential_in_a_section_is_a_secret_and_redacted() {
        // Moved from core's `every_credential_in_the_config_is_a_secret_
        // and_redacted`: its platform half. One route, so a route's
        // fields are walked too.
        let base = config("platforms:\n  webhook:\n    routes:\n      r: {scheme: github}\n");
        let mut sections = serde_json::Map::new();
        for p in PLATFORMS {
            let checked = (p.check)(&base, &origin("")).unwrap();
            sections.insert(p.name.to_owned(), checked.shown);
        }
        let mut tree = serde_json::json!({ "platforms": sections });
        let mut planted = Vec::new();
        plant(&mut tree, "", &mut planted);
        let paths: Vec<&str> = planted.iter().map(|(p, _, _)| p.as_str()).collect();
        for want in [
            ".platforms.telegram.token",
            ".platforms.discord.token",
            ".platforms.mattermost.token",
            ".platforms.slack.bot_token",
            ".platforms.slack.app_token",
            ".platforms.webhook.routes.r.secret",
            ".platforms.matrix.access_token",
            ".platforms.whatsapp_cloud.token",
            ".platforms.whatsapp_cloud.app_secret",
            ".platforms.whatsapp_cloud.verify_token",
            ".platforms.feishu.app_secret",
            ".platforms.feishu.encrypt_key",
            ".platforms.feishu.verification_token",
            ".platforms.sms.auth_token",
            ".platforms.email.password",
            ".platforms.homeassistant.token",
            ".platforms.homeassistant.conversation_token",
            ".platforms.dingtalk.client_secret",
            ".platforms.dingtalk.webhook_secret",
            ".platforms.qqbot.client_secret",
            ".platforms.weixin.token",
            ".platforms.yuanbao.app_key",
            ".platforms.yuanbao.app_secret",
            ".platforms.wecom_callback.corp_secret",
            ".platforms.wecom_callback.token",
            ".platforms.wecom_callback.encoding_aes_key",
            ".platforms.wecom.secret",
            ".platforms.line.channel_access_token",
            ".platforms.line.channel_secret",
            ".platforms.bluebubbles.password",
            ".platforms.google_chat.service_account_key",
        ] {
            let name = want.split('.').nth(2).unwrap_or_default();
            if platform(name).is_some() {
                assert!(paths.contains(&want), "{want} was not planted: {paths:?}");
            }
        }
        let text = serde_json::to_string(&tree).unwrap();
        let c = config(&text);
        let redactor = talaria_core::Redactor::new(c.secret_values());
        let printed = serde_json::to_string(&c).unwrap();
        let debugged = format!("{c:?}");
        // What each owner reads and shows (`config show`).
        let mut shown = String::new();
        for p in PLATFORMS {
            let checked = (p.check)(&c, &origin(&text)).unwrap();
            assert!(checked.warnings.is_empty(), "{:?}", checked.warnings);
            shown.push_str(&checked.shown.to_string());
        }
        for (path, value, is_url) in &planted {
            let parts: Vec<String> = if *is_url {
                let url = talaria_core::config::url_secrets(value);
                assert_eq!(url.len(), 2, "{path}: {url:?}");
                url
            } else {
                vec![value.clone()]
            };
            let redacted = redactor.redact(&format!("the model read: {value}."));
            for part in &parts {
                assert!(
                    !redacted.contains(part.as_str()),
                    "{path}: {part} survives as {redacted}"
                );
            }
            // A credential held by name must be a `Secret` in its
            // section's type: printing the section masks it.
            if !is_url {
                assert!(
                    !shown.contains(value.as_str()),
                    "{path} is shown in plain: not a Secret"
                );
                assert!(
                    !printed.contains(value.as_str()),
                    "{path} is printed in plain"
                );
                assert!(
                    !debugged.contains(value.as_str()),
                    "{path} is in Debug in plain"
                );
            }
        }
    }
}
