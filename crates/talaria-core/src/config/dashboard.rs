//! `dashboard:`: the web dashboard the gateway serves beside its API.

use serde::{Deserialize, Serialize};

use super::Secret;

/// `dashboard:`. The dashboard is a client of the API server: it is served
/// only when the API server is, under `/ui` on the API's port unless
/// `port` gives it its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DashboardConfig {
    /// `None` means "served whenever the API server is".
    pub enabled: Option<bool>,
    /// A port of its own; unset, the dashboard shares the API server's.
    pub port: Option<u16>,
    /// The interface its own port listens on (only with `port`):
    /// loopback unless set.
    pub host: Option<String>,
    /// An argon2 hash (`$argon2id$...`, from `talaria dashboard
    /// hash-password`) of a password that logs in besides the API key.
    pub password_hash: Option<Secret>,
    /// Hours a login lasts.
    pub session_hours: u64,
}

impl Default for DashboardConfig {
    fn default() -> DashboardConfig {
        DashboardConfig {
            enabled: None,
            port: None,
            host: None,
            password_hash: None,
            session_hours: 12,
        }
    }
}
