//! `dashboard:` resolved: whether it is served, where, and how one logs
//! in.

use std::time::Duration;

use argon2::password_hash::{PasswordHash, PasswordHasher, SaltString};
use talaria_core::Secret;
use talaria_core::config::DashboardConfig;

/// The longest a login may be set to last.
const MAX_SESSION_HOURS: u64 = 24 * 30;

/// Why the dashboard cannot be set up as configured.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// `enabled: true`, but the API server, whose client it is, is off.
    #[error(
        "dashboard.enabled is true, but the API server is not enabled: the dashboard is \
         served by it; set API_SERVER_KEY (or platforms.api_server.key)"
    )]
    NeedsApiServer,
    /// `password_hash` is not an argon2 hash.
    #[error(
        "dashboard.password_hash is not an argon2 hash ({0}); make one with `talaria dashboard \
         hash-password`"
    )]
    BadPasswordHash(String),
    /// `session_hours` is 0 or absurdly long.
    #[error("dashboard.session_hours is {0}; use 1 to {MAX_SESSION_HOURS}")]
    BadSessionHours(u64),
    /// Hashing a new password failed.
    #[error("cannot hash the password: {0}")]
    Hash(String),
}

/// How the dashboard is served.
#[derive(Debug, Clone)]
pub struct DashboardSettings {
    /// Its own `host` and `port`, or `None` to share the API server's.
    pub own_listener: Option<(String, u16)>,
    /// The argon2 hash of the password that logs in besides the API key.
    pub password_hash: Option<Secret>,
    /// How long a login lasts.
    pub session_ttl: Duration,
}

impl DashboardSettings {
    /// The settings, or `None` when the dashboard is not served: it is
    /// served when the API server is, unless `enabled: false`.
    ///
    /// # Errors
    /// `enabled: true` without the API server, a `password_hash` that is
    /// not an argon2 hash, or `session_hours` out of range.
    pub fn from_config(
        config: &DashboardConfig,
        api_server_enabled: bool,
    ) -> Result<Option<DashboardSettings>, SettingsError> {
        match (config.enabled, api_server_enabled) {
            (Some(false), _) | (None, false) => return Ok(None),
            (Some(true), false) => return Err(SettingsError::NeedsApiServer),
            (_, true) => {}
        }
        let password_hash = config
            .password_hash
            .as_ref()
            .filter(|h| !h.expose().trim().is_empty())
            .map(|h| {
                let text = h.expose().trim();
                check_hash(text).map(|()| Secret::new(text))
            })
            .transpose()?;
        if config.session_hours == 0 || config.session_hours > MAX_SESSION_HOURS {
            return Err(SettingsError::BadSessionHours(config.session_hours));
        }
        let own_listener = config.port.map(|port| {
            let host = config
                .host
                .as_deref()
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .unwrap_or("127.0.0.1");
            (host.to_owned(), port)
        });
        Ok(Some(DashboardSettings {
            own_listener,
            password_hash,
            session_ttl: Duration::from_secs(config.session_hours * 3600),
        }))
    }
}

/// Whether `text` is an argon2 hash in the PHC string format.
fn check_hash(text: &str) -> Result<(), SettingsError> {
    let parsed =
        PasswordHash::new(text).map_err(|e| SettingsError::BadPasswordHash(e.to_string()))?;
    if !parsed.algorithm.as_str().starts_with("argon2") {
        return Err(SettingsError::BadPasswordHash(format!(
            "its algorithm is {}",
            parsed.algorithm
        )));
    }
    Ok(())
}

/// The argon2id hash of `password`, with a fresh salt, for
/// `dashboard.password_hash`.
///
/// # Errors
/// An empty password, or a failure of the hash itself.
pub fn hash_password(password: &str) -> Result<String, SettingsError> {
    if password.is_empty() {
        return Err(SettingsError::Hash("the password is empty".to_owned()));
    }
    let salt_bytes: [u8; 16] = rand::random();
    let salt =
        SaltString::encode_b64(&salt_bytes).map_err(|e| SettingsError::Hash(e.to_string()))?;
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| SettingsError::Hash(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> DashboardConfig {
        DashboardConfig::default()
    }

    #[test]
    fn served_with_the_api_server_unless_turned_off() {
        assert!(
            DashboardSettings::from_config(&config(), false)
                .unwrap()
                .is_none()
        );
        let on = DashboardSettings::from_config(&config(), true)
            .unwrap()
            .unwrap();
        assert!(on.own_listener.is_none());
        assert_eq!(on.session_ttl, Duration::from_secs(12 * 3600));
        let off = DashboardConfig {
            enabled: Some(false),
            ..config()
        };
        assert!(
            DashboardSettings::from_config(&off, true)
                .unwrap()
                .is_none()
        );
        let forced = DashboardConfig {
            enabled: Some(true),
            ..config()
        };
        let err = DashboardSettings::from_config(&forced, false).unwrap_err();
        assert!(err.to_string().contains("API_SERVER_KEY"), "{err}");
    }

    #[test]
    fn its_own_port_listens_on_loopback_unless_told() {
        let own = DashboardConfig {
            port: Some(9119),
            ..config()
        };
        let on = DashboardSettings::from_config(&own, true).unwrap().unwrap();
        assert_eq!(on.own_listener, Some(("127.0.0.1".to_owned(), 9119)));
    }

    #[test]
    fn a_password_hash_must_be_argon2() {
        let hash = hash_password("correct horse").unwrap();
        assert!(hash.starts_with("$argon2id$"), "{hash}");
        let good = DashboardConfig {
            password_hash: Some(Secret::new(&hash)),
            ..config()
        };
        assert!(DashboardSettings::from_config(&good, true).is_ok());
        for bad in ["hunter2", "$2b$12$abcdefghijklmnopqrstuv"] {
            let bad = DashboardConfig {
                password_hash: Some(Secret::new(bad)),
                ..config()
            };
            let err = DashboardSettings::from_config(&bad, true).unwrap_err();
            assert!(err.to_string().contains("hash-password"), "{err}");
        }
        assert!(hash_password("").is_err());
        let zero = DashboardConfig {
            session_hours: 0,
            ..config()
        };
        assert!(DashboardSettings::from_config(&zero, true).is_err());
    }
}
