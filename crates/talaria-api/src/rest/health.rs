//! `GET /health/detailed`: what `talaria gateway status` shows, for
//! dashboards and probes: the platforms with their liveness, the nodes of
//! the deployment, the delivery ledger's counts by state, the cron jobs
//! and the turns running now.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use talaria_store::{CronStore, JobState};

use super::{gateway, store_error};
use crate::AppState;
use crate::error::ApiError;

/// `GET /health/detailed` (behind the key: it names platforms, hosts and
/// jobs).
pub(super) async fn detailed(State(state): State<Arc<AppState>>) -> Response {
    async {
        let services = gateway(&state)?;
        let store = &services.store;
        let platforms: BTreeMap<String, Value> = services
            .board
            .snapshot()
            .into_iter()
            .map(|(name, s)| {
                (
                    name,
                    json!({
                        "liveness": s.liveness.to_string(),
                        "since": s.since,
                        "last_error": s.last_error,
                    }),
                )
            })
            .collect();
        let now = talaria_core::unix_now();
        let nodes: Vec<Value> = store
            .nodes()
            .await
            .map_err(store_error)?
            .into_iter()
            .map(|n| {
                json!({
                    "id": n.id.as_str(),
                    "host": n.host,
                    "pid": n.pid,
                    "version": n.version,
                    "joined_at": n.joined_at,
                    "heartbeat_at": n.heartbeat_at,
                    "lease_until": n.lease_until,
                    "alive": n.lease_until > now,
                })
            })
            .collect();
        let ledger: BTreeMap<&str, u64> = store
            .obligation_counts()
            .await
            .map_err(store_error)?
            .into_iter()
            .map(|(s, n)| (s.as_str(), n))
            .collect();
        let cron = cron_state(&state, store.as_ref()).await?;
        Ok::<_, ApiError>(
            Json(json!({
                "status": "ok",
                "platform": "talaria",
                "version": env!("CARGO_PKG_VERSION"),
                "pid": std::process::id(),
                "platforms": platforms,
                "nodes": nodes,
                "ledger": ledger,
                "cron": cron,
                "running_turns": {"gateway": (services.running_turns)()},
            }))
            .into_response(),
        )
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// Jobs by state and the run due next.
async fn cron_state(state: &AppState, store: &dyn CronStore) -> Result<Value, ApiError> {
    let jobs = store.jobs().await.map_err(store_error)?;
    let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
    for job in &jobs {
        *by_state.entry(job.state.as_str()).or_default() += 1;
    }
    let next = jobs
        .iter()
        .filter(|j| j.state == JobState::Scheduled)
        .filter_map(|j| j.next_run_at.map(|at| (at, j)))
        .min_by_key(|(at, _)| *at);
    Ok(json!({
        "enabled": state.agent.parts().config.cron.enabled,
        "jobs": jobs.len(),
        "by_state": by_state,
        "next_run": next.map(|(at, j)| json!({"job_id": j.id, "name": j.name, "at": at})),
    }))
}
