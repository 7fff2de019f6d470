//! `metrics:`: the Prometheus numbers the API server serves at `/metrics`.

use serde::{Deserialize, Serialize};

/// `metrics:`. `/metrics` is served on the API server's port, behind its
/// key like every other route, unless `public` is set and the server
/// listens on loopback only, where a local Prometheus may scrape without
/// one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MetricsConfig {
    /// Serve `/metrics` without the key (honoured on loopback only).
    pub public: bool,
}
