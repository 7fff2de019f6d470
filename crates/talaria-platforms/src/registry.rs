//! Every platform this build knows, one entry each: its name, its
//! configuration section (read and checked by the platform's own type) and
//! its constructor. Whatever walks the platforms (`talaria gateway run`,
//! `talaria send`, `talaria config check` and `config show`, the docs'
//! table) walks [`PLATFORMS`], so adding a platform is its folder and one
//! line here.

use std::error::Error;
use std::sync::Arc;

use talaria_adapter::Adapter;
use talaria_core::config::{Checked, ConfigError, Origin, PlatformSection};
use talaria_core::effective::EnvKey;
use talaria_core::{Config, Env};
use talaria_store::CursorStore;

#[cfg(feature = "ingress")]
use crate::ingress::Mount;

/// What a constructor may use: the configuration as loaded, the
/// environment, and the store for a platform's sync position.
pub struct Setup<'a> {
    /// The whole configuration; a platform reads its own section.
    pub config: &'a Config,
    /// `.env` overlaid by the process environment.
    pub env: &'a Env,
    /// Where an adapter keeps its position across restarts.
    pub cursors: Arc<dyn CursorStore>,
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
    #[cfg(feature = "sms")]
    crate::sms::ENTRY,
    #[cfg(feature = "email")]
    crate::email::ENTRY,
    #[cfg(feature = "homeassistant")]
    crate::homeassistant::ENTRY,
    #[cfg(feature = "webhook")]
    crate::webhook::ENTRY,
];

/// The entry named `name`.
pub fn platform(name: &str) -> Option<&'static Platform> {
    PLATFORMS.iter().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
